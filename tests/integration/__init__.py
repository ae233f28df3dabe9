"""Tests that train a model, start a process (the CLI, torchrun, deepspeed, an MLflow server) or take
over ~2 s. A file split from a unit file of the same name imports what both halves need from it."""
