"""resume=PATH: a job continues from the checkpoint it names, of this same job only, and drops what
its job did after it; every other case is one line, exit 2, with nothing touched."""
import os
from types import SimpleNamespace

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.fsutil import write_json
from pipeline.job_record import JobRecord
from pipeline.jobs.resume import decide
from pipeline.layout import OutputDir

SINGLE = SimpleNamespace(is_main=True)


def record(**changes) -> JobRecord:
    return JobRecord(**{**dict(config={"task": "sentiment", "model": "preset:bangla-tiny", "train.lr": 3e-4},
                                global_batch="16 rows", world_size=1, backend="torch", precision="fp32", data={}),
                        **changes})


def plan(out: OutputDir, resume, asked: JobRecord | None = None):
    cfg = SimpleNamespace(overwrite=False, resume=str(resume), accepted_changes=[])
    return SimpleNamespace(cfg=cfg, out=out, record=asked or record())


def saved(out: OutputDir, step: int, mtime: float):
    """A complete checkpoint of record()'s job at `step`, its manifest written at `mtime`."""
    path = out.checkpoint(step)
    path.mkdir(parents=True)
    write_json(path / "job.json", record().to_json())
    write_json(path / "manifest.json", {"step": step, "files": {}})
    os.utime(path / "manifest.json", (mtime, mtime))
    return path


def best_saved(out: OutputDir, mtime: float):
    out.best.mkdir(exist_ok=True)
    (out.best / "model.safetensors").write_bytes(b"weights")
    os.utime(out.best / "model.safetensors", (mtime, mtime))


def test_a_named_checkpoint_is_resumed_and_what_followed_it_is_removed(tmp_path):
    out = OutputDir(tmp_path / "out")
    for step in (10, 20, 30):
        saved(out, step, mtime=1000 + step)
    best_saved(out, mtime=1025)  # saved at step 25's evaluation: after the checkpoint named
    start = decide(plan(out, out.checkpoint(20)))
    assert (start.checkpoint.path, start.checkpoint.step, start.named) == (out.checkpoint(20), 20, True)
    assert out.checkpoint(30).is_dir() and out.best.is_dir()  # nothing removed before the stage is confirmed
    start.rewind(SINGLE)
    assert [p.name for p in out.checkpoint_dirs()] == ["step-00000010", "step-00000020"]
    assert not out.best.exists()

    best_saved(out, mtime=1015)  # a best model from before the checkpoint is the job's: kept
    decide(plan(out, out.checkpoint(20))).rewind(SINGLE)
    assert (out.best / "model.safetensors").is_file()


@pytest.mark.parametrize("case, message", [
    ("missing", r"^resume=.*step-00000099: no such directory$"),
    ("no manifest", r"^resume=.*step-00000040: not a complete checkpoint \(.*manifest.json.*\); resume=auto takes "),
    ("another output_dir", r"^resume=.*other/checkpoints/step-00000010: a checkpoint of another output_dir "
                           r"\(.*other\), not of this job's \(.*out\); to continue that job: output_dir=.*other$"),
    ("another job", r"^resume: checkpoint .*step-00000010: trained with other settings: precision: fp32 -> bf16\. "),
    ("finished", r"^resume=.*step-00000010: .*out holds a finished job \(its metrics.json\); a finished job is not "),
])
def test_a_checkpoint_that_is_not_this_jobs_to_continue_is_one_line_and_nothing_is_touched(tmp_path, case, message):
    out, other = OutputDir(tmp_path / "out"), OutputDir(tmp_path / "other")
    saved(out, 10, mtime=1000)
    saved(other, 10, mtime=1000)
    out.checkpoint(40).mkdir()  # a save killed before its manifest
    asked = record(precision="bf16") if case == "another job" else record()
    if case == "finished":
        write_json(out / "metrics.json", {"test/main": 0.5})
    named = {"missing": out.checkpoint(99), "no manifest": out.checkpoint(40),
             "another output_dir": other.checkpoint(10)}.get(case, out.checkpoint(10))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(UserError, match=message) as e:
        decide(plan(out, named, asked))
    assert "\n" not in str(e.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("value, ok", [("auto", True), ("never", True), ("outputs/x/checkpoints/step-00000010", True),
                                       ("ato", False), ("", False)])
def test_resume_takes_never_auto_or_a_path_and_a_misspelt_word_is_refused(value, ok):
    if ok:
        assert load_config(None, [f"resume={value}"]).resume == value
        return
    with pytest.raises(UserError, match=r"^config: resume=\S*: must be never \| auto \| a checkpoint's directory"):
        load_config(None, [f"resume={value}"])
