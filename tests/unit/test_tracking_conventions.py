"""MLflow's conventions a user relies on: MLFLOW_EXPERIMENT_NAME and MLFLOW_TRACKING_URI where the config
leaves them unset (the config wins when set), the run saying which, and mlflow.user on every run."""
import getpass

import pytest
import torch
import yaml

from pipeline import names
from pipeline.config import load_config
from pipeline.job.records.stage_run import StageRun, run_tags, write_config
from pipeline.runtime.world import Runtime
from pipeline.tracking.store import resolve_experiment, resolve_uri

RUN = StageRun("train", "preset:bangla-tiny", "fp32")


def settled(tmp_path, *overrides):
    cfg = load_config(None, [f"output_dir={tmp_path}", *overrides])
    return cfg, Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


@pytest.mark.parametrize("overrides, env, experiment, source", [
    ([], {}, "pipeline", "default"),
    ([], {"MLFLOW_EXPERIMENT_NAME": "mine"}, "mine", "env:MLFLOW_EXPERIMENT_NAME"),
    (["tracking.experiment=cfg"], {"MLFLOW_EXPERIMENT_NAME": "mine"}, "cfg", "config"),
])
def test_the_experiment_comes_from_the_config_else_mlflows_variable(tmp_path, monkeypatch, overrides, env, experiment,
                                                                    source):
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg, rt = settled(tmp_path, *overrides)
    assert resolve_experiment(cfg.tracking.experiment) == experiment
    write_config(cfg, rt, "sqlite:////x.db")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["tracking"]["experiment"] == experiment
    tags = run_tags(cfg, rt, RUN)
    assert tags[names.TAG_EXPERIMENT_FROM] == source and tags[names.TAG_USER] == getpass.getuser()


def test_the_tracking_uri_comes_from_the_config_else_mlflows_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    cfg, rt = settled(tmp_path)
    assert resolve_uri(cfg.tracking.uri) == f"sqlite:///{tmp_path}/env.db"
    assert run_tags(cfg, rt, RUN)[names.TAG_URI_FROM] == "env:MLFLOW_TRACKING_URI"
    cfg, rt = settled(tmp_path, f"tracking.uri=sqlite:///{tmp_path}/cfg.db")
    assert resolve_uri(cfg.tracking.uri) == f"sqlite:///{tmp_path}/cfg.db"
    assert run_tags(cfg, rt, RUN)[names.TAG_URI_FROM] == "config"


def test_the_ad_hoc_demo_config_logs_apart_from_the_demo_study():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    demo = load_config(str(root / "configs" / "demo.yaml"))
    from pipeline.study import load_study

    study = load_study(str(root / "launch" / "studies" / "demo.yaml"))[0]
    assert demo.tracking.experiment and demo.tracking.experiment != study.name


def test_the_run_records_its_output_dir_resolved(tmp_path):
    """What an export of a copied output_dir tells the original's run from its own by."""
    from pathlib import Path

    cfg, rt = settled(tmp_path)
    cfg.output_dir = "out"
    assert run_tags(cfg, rt, RUN)[names.TAG_OUTPUT_DIR] == str(Path.cwd().resolve() / "out")
