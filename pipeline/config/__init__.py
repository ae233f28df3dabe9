"""The configuration: dataclasses whose fields carry their meaning (the top level in schema.py, with
a settled config to and from a job record's form; the sections with their own checks in
sections.py), the text of a YAML
value or override read as its field's type (coerce.py), dotted keys and the near-miss hint
(keys.py), the Hugging Face Trainer's names and this project's keys for them
(trainer_names.py), the precision modes, each declared once (precision_modes.py: torch-free, so a
config is validated and a report grouped without torch; runtime/precision.py gives them their torch
behaviour), the one reader of the files a user names (documents.py), the secrets masked wherever a
config is shown (secrets.py), the DeepSpeed JSON a `deepspeed` value names (deepspeed_files.py), the
default output_dir (output_dir.py), and the reference that --help and docs/configuration.md print
(reference.py).

May import: pipeline.errors, and the task registry's names (pipeline.tasks, whose __init__ imports
only errors when loaded): no torch, no transformers. What a job derives from its config (the
settled plan) is pipeline.job.plan's.

Inside, lowest first: coerce documents precision_modes secrets | deepspeed_files trainer_names | keys |
sections | schema | output_dir reference
"""
from pipeline.config.schema import (
    Config,
    DataConfig,
    KDConfig,
    TrackingConfig,
    TrainConfig,
    choices,
    flatten,
    load_config,
)

__all__ = ["Config", "DataConfig", "KDConfig", "TrackingConfig", "TrainConfig", "choices", "flatten", "load_config"]
