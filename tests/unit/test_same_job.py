"""resume=auto continues the same job and never another: a job preempted mid-run (a real SIGTERM,
in process) is resumed with one thing changed, and each change is either refused in one line
naming it, before anything is loaded or written, or (the safe keys, the split of the global
batch, an explicit accept_changes) continued and recorded."""
import json
from pathlib import Path

import pytest

from pipeline import job_record
from pipeline.config import load_config
from pipeline.data.loaders import ResumableSampler
from pipeline.errors import UserError
from pipeline.fsutil import write_json
from pipeline.job import same_job


def test_an_older_checkpoint_without_its_jobs_record_is_refused_in_one_line(tmp_path):
    record = job_record.JobRecord({}, "32 rows", 1, "torch", "fp32", {})
    with pytest.raises(UserError, match=r"^resume: checkpoint /x: written by an older version"):
        same_job.check_settings(Path("/x"), None, record, [])


def test_a_deepspeed_checkpoint_resumes_only_on_its_world_size():
    two = job_record.JobRecord({}, "32 rows", 2, "deepspeed", "bf16", {})
    one = job_record.JobRecord({}, "32 rows", 1, "deepspeed", "bf16", {})
    with pytest.raises(UserError, match="a DeepSpeed checkpoint of 2 processes .* launch 2 processes"):
        same_job.check_settings(Path("/c"), two, one, [])
    torch_two, torch_one = (job_record.JobRecord({}, "32 rows", n, "torch", "bf16", {}) for n in (2, 1))
    assert same_job.check_settings(Path("/c"), torch_two, torch_one, []) == []


# ------------------------------------------------------------------ the records themselves


def record(**changes):
    base = dict(config={"seed": 1, "train.lr": 1e-3, "train.batch_size": 32, "train.grad_accum": 1,
                        "train.log_every": 10, "data.train": "a.tsv", "tracking.experiment": "x"},
                global_batch="64 rows", world_size=2, backend="torch", precision="bf16",
                data={"train": {"file": "a.tsv", "fingerprint": "sha256:" + "a" * 64}})
    config = {**base.pop("config"), **changes.pop("config", {})}
    return job_record.JobRecord(config=config, **{**base, **changes})


def test_what_counts_as_a_change():
    old = record()
    same = record(config={"train.batch_size": 16, "train.grad_accum": 2, "train.log_every": 1,
                          "tracking.experiment": "y", "data.train": "moved/a.tsv"}, world_size=2)
    assert same_job.changes(old, same) == []
    new = record(config={"seed": 2, "model_config.hidden_dropout_prob": 0.0}, global_batch="32 rows",
                 precision="fp32", data={"train": {"file": "a.tsv", "fingerprint": "sha256:" + "b" * 64}})
    assert [str(c) for c in same_job.changes(old, new)] == [
        "model_config.hidden_dropout_prob: (unset) -> 0.0", "seed: 1 -> 2", "global_batch: 64 rows -> 32 rows",
        "precision: bf16 -> fp32", "data.train: a.tsv changed (fingerprint sha256:aaaaaaaaaaaa -> sha256:bbbbbbbbbbbb)"]


def test_another_held_out_draw_is_a_change_that_names_both_draws():
    def held(draw):
        return {"train": {"file": "a.tsv", "fingerprint": "sha256:" + "a" * 64},
                "dev": {"file": f"a.tsv | {draw}", "fingerprint": f"sha256:{'a' * 64} | {draw}"}}

    assert [str(c) for c in same_job.changes(record(data=held("holdout:0.1:0")), record(data=held("holdout:0.2:0")))] \
        == ["data.dev: a.tsv | holdout:0.2:0 changed (fingerprint sha256:aaaaaaaaaaaa | holdout:0.1:0 -> "
            "sha256:aaaaaaaaaaaa | holdout:0.2:0)"]


def test_accept_changes_names_keys_that_exist():
    assert load_config(None, ["accept_changes=train.lr, data.train,tokenizer"]).accepted_changes == [
        "train.lr", "data.train", "tokenizer"]
    with pytest.raises(UserError, match=r"^config: accept_changes=train\.lrr: no such key \(did you mean train\.lr"):
        load_config(None, ["accept_changes=train.lrr"])


@pytest.mark.parametrize("grouped", [False, True])
def test_a_position_in_optimizer_steps_is_the_same_rows_on_one_process_or_two(grouped):
    """A job of 2 processes x 16 rows resumed on 1 process x 16 rows x 2 accumulation steps (the
    fallback) continues with exactly the rows the 2 processes had left."""
    lengths = [(i * 7) % 23 + 1 for i in range(200)]
    steps_done = 3

    def remaining(world, accum):
        rows = []
        for rank in range(world):
            sampler = ResumableSampler(range(200), num_replicas=world, rank=rank, shuffle=True, seed=5,
                                       lengths=lengths if grouped else None, batch_size=16 * accum)
            sampler.set_epoch(1)
            sampler.skip = steps_done * accum * 16  # Loaders.start_epoch for Progress.epoch_steps
            rows.append(list(sampler))
        return sorted(i for r in rows for i in r)

    assert remaining(world=1, accum=2) == remaining(world=2, accum=1)


def test_a_record_survives_its_file(tmp_path):
    r = record(tokenizer="t", architecture={"hidden_size": 8, "parameters": "sha256:x"}, accepted=["a"])
    write_json(tmp_path / "job.json", r.to_json())  # as the checkpointer writes it
    assert job_record.read(tmp_path / "job.json") == r
    assert json.loads((tmp_path / "job.json").read_text())["global_batch"] == "64 rows"
    assert job_record.read(tmp_path / "none.json") is None
