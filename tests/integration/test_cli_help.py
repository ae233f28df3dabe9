"""`train --help` / `distill --help` list every config key from the dataclasses' docstrings: the tests
that train a model or start a process (the others are in tests/unit/test_cli_help.py)."""

import pytest

from helpers import run_cli
from pipeline.config import reference
from unit.test_cli_help import KEYS, leaf_keys  # noqa: F401


@pytest.mark.slow  # starts the CLI's process
def test_train_help_lists_every_key_with_its_default_and_meaning():
    result = run_cli("train", "--help")  # the real entry point, once: it must not read --help as a config file
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("usage: python -m pipeline train [CONFIG.yaml] [key=value ...]")
    assert "key=value" in out and "CONFIG.yaml" in out
    assert len(KEYS) > 40 and "train.lr" in KEYS and "tracking.system_metrics_interval" in KEYS
    for key, default in KEYS.items():
        assert f"\n  {key} = {default}  [" in out, key
    flat = " ".join(out.split())
    assert ("train.epochs = unset [int | None] Passes over the training set; unset: the task's "
            "(3; error_cls 5, qa 8)") in flat
    assert "precision = fp32 [fp32 | tf32 | fp16 | bf16 | bf16-pure | auto] fp32 (strict, TF32 off)" in flat
    for _, _, keys in reference.sections():  # every docstring's text, whitespace aside
        for key, _, _, meaning in keys:
            assert meaning and meaning in flat, f"{key}: no docstring under the field"
