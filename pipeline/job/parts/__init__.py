"""The training loop's parts, each owning its piece of the loop's state and saving and restoring it
(checkpoint.Stateful): where the loop is (progress), the step losses and the LR schedule they move
(step_losses), the best model and its best/ directory (best_model), the optimizer and its LR
schedule (optim); and the Checkpointer that saves them on its own cadence and restores them. The
loop itself is job/loop.py, its records job/records/.

May import: the layers below the job (errors ... tracking).

Inside, lowest first: best_model checkpoint optim progress | step_losses
"""
