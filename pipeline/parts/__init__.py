"""The training loop's parts that save and restore themselves (checkpoint.Stateful): where the loop
is (progress), the step losses, the best model and its best/ directory, the optimizer and its LR
schedule; and the checkpoint that collects them by name. The loop itself is pipeline/train.py.

May import: errors, names, fsutil, layout, config, runtime.
"""
