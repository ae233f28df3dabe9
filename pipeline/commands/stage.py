"""`python -m pipeline train|distill [CONFIG.yaml] [key=value ...]`: one stage as a job (job/run.py)."""
from __future__ import annotations

from pipeline.errors import UserError

HELP = {"-h", "--help"}


def train(args: list[str]) -> int:
    return _stage("train", args)


def distill(args: list[str]) -> int:
    return _stage("distill", args)


def _stage(kind: str, args: list[str]) -> int:
    if HELP.intersection(args):  # usage and every config key; before the config, as asking must not fail
        from pipeline.config import reference

        print(reference.help_text(kind), end="")
        return 0
    from pipeline.config import load_config

    config_path = None
    if args and "=" not in args[0]:
        config_path, args = args[0], args[1:]
    for a in args:
        if "=" not in a:
            raise UserError(f"argument {a!r}: expected key=value (a config file goes first)")
    cfg = load_config(config_path, args)
    from pipeline.job.run import run

    run(cfg, kind=kind)
    return 0
