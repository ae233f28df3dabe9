"""Config: the tests that train a model or start a process (the others are in
tests/unit/test_config.py)."""
import pytest

from helpers import run_cli


@pytest.mark.slow
def test_cli_reports_one_line_and_exit_2(tmp_path):
    result = run_cli("train", "train.lr=-1", f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: config: train.lr=-1.0: must be > 0"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_accepts_the_deepspeed_launchers_local_rank(tmp_path):
    result = run_cli("train", "--local_rank=0", "train.batch_size=0")
    assert result.returncode == 2 and "train.batch_size=0" in result.stderr
