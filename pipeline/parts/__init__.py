"""The training loop's parts, each owning its piece of the loop's state and saving and restoring it
(checkpoint.Stateful): where the loop is (progress), the step losses, the best model and its best/
directory with its model card (model_card), the optimizer and its LR schedule; and the
Checkpointer that saves them on its own cadence and restores them. The loop itself is
pipeline/train.py, its records tracking/metrics.py.

May import: errors, names, fsutil, layout, tasks, config, runtime.

Inside, lowest first: model_card | best_model checkpoint optim progress step_losses
"""
