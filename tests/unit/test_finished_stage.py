"""A finished stage read back from its output_dir (pipeline/tracking/finished_stage.py): its settled
configuration is its job record's, whatever config.yaml says; the model it trained is named as the
stage built it; a directory without job.json is refused in one line naming it (export --check exits
2); and its splits are the rows and features the stage itself prepared."""
import pytest
import torch
import yaml

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.fsutil import write_json, write_text
from pipeline.job.plan import settle
from pipeline.layout import OutputDir
from pipeline.runtime.world import Runtime
from pipeline.tracking import finished_stage

SINGLE = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


def test_the_settled_config_is_the_job_records_not_config_yamls(tmp_path):
    out = OutputDir(tmp_path / "out")
    cfg = load_config(None, ["model=preset:bangla-tiny", f"output_dir={out.root}", "data.train=samples",
                             "data.dev=holdout:0.2", "model_config.hidden_dropout_prob=0",
                             "tracking.tags.mlflow.note.content=a note", "train.max_length=48"])
    plan = settle(cfg, "train", SINGLE)
    out.root.mkdir()
    write_json(out.job, plan.record.to_json())
    write_text(out.config, yaml.safe_dump({"task": "ner", "train": {"max_length": 999}}))  # not what it reads

    stage = finished_stage.read(out, "export --check")
    assert stage.cfg == plan.cfg  # every default filled in as the job filled it: lr, epochs, padding, compile
    assert (stage.task.name, stage.model_spec, stage.kind, stage.best) == ("sentiment", "preset:bangla-tiny",
                                                                           "train", None)
    assert stage.cfg.train.max_length == 48 and stage.cfg.tracking.tags == {"mlflow": {"note": {"content": "a note"}}}


def test_an_unnamed_model_is_the_one_the_stage_built(tmp_path):
    out = OutputDir(tmp_path)
    plan = settle(load_config(None, [f"output_dir={tmp_path}"]), "train", SINGLE)
    write_json(out.job, plan.record.to_json())
    assert finished_stage.read(out, "report").model_spec == plan.task.default_model
    # a student distilled without a model named: from_teacher: as many layers as it has
    write_json(out.job, plan.record.built("tok", {"num_hidden_layers": 3}, "sha256:teacher").to_json())
    stage = finished_stage.read(out, "report")
    assert (stage.kind, stage.model_spec) == ("distill", "from_teacher:3")


def test_a_directory_without_a_job_record_is_refused_in_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "best").mkdir()
    with pytest.raises(UserError) as e:
        finished_stage.read(tmp_path, "export --check")
    message = str(e.value)
    assert len(message.splitlines()) == 1 and str(tmp_path) in message and OutputDir.JOB in message
    assert main(["export", str(tmp_path), "--check"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_its_splits_are_the_rows_and_features_the_stage_prepared(tmp_path, monkeypatch):
    from pipeline.job.stage import build_stage

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    out = OutputDir(tmp_path / "out")
    cfg = load_config(None, ["model=preset:bangla-tiny", "train.max_length=32", f"output_dir={out.root}",
                             "data.train=samples", "data.dev=holdout:0.25", "data.test=samples"])
    built = build_stage(settle(cfg, "train", SINGLE))
    out.root.mkdir()
    write_json(out.job, built.record.to_json())

    splits = finished_stage.read(out, "export --check").splits(("dev", "test"))
    assert set(splits.examples) == {"dev", "test"}
    prepared = splits.features(built.tokenizer, built.cfg.train.max_length)
    for split in ("dev", "test"):
        assert splits.examples[split] == built.examples[split]
        assert prepared[split].key == built.features[split].key  # the same entry: the same rows, tokenized alike
        assert prepared[split].dataset.to_dict() == built.features[split].dataset.to_dict()
    held_out = {e["id"] for e in splits.examples["dev"]}
    assert held_out and not held_out & {e["id"] for e in built.examples["train"].examples()}  # never trained on
