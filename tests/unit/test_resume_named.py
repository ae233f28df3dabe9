"""resume=PATH: a job continues from the checkpoint it names, of this same job only, and drops what
its job did after it (best/ back to the checkpoint's best model); every other case is one line, exit
2, with nothing touched."""
from types import SimpleNamespace

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.fsutil import write_json
from pipeline.job.parts import checkpoint
from pipeline.job.parts.best_model import BestModel
from pipeline.job.resume import decide
from pipeline.job_record import JobRecord
from pipeline.layout import CheckpointFiles, OutputDir

SINGLE = SimpleNamespace(is_main=True)


def record(**changes) -> JobRecord:
    return JobRecord(**{**dict(config={"task": "sentiment", "model": "preset:bangla-tiny", "train.lr": 3e-4},
                                global_batch="16 rows", world_size=1, backend="torch", precision="fp32", data={}),
                        **changes})


def plan(out: OutputDir, resume, asked: JobRecord | None = None):
    cfg = SimpleNamespace(overwrite=False, resume=str(resume), accepted_changes=[])
    return SimpleNamespace(cfg=cfg, out=out, record=asked or record())


def best_saved(out: OutputDir, weights: bytes):
    """best/ as BestModel.consider replaces it: a new directory, its weights a new file."""
    new = out.root / "best.new"
    new.mkdir()
    (new / "config.json").write_text("{}")
    (new / "model.safetensors").write_bytes(weights)
    if out.best.exists():
        (out.root / "best").rename(out.root / "best.old")
    new.rename(out.best)


def saved(out: OutputDir, step: int):
    """A checkpoint of record()'s job at `step`, as the Checkpointer writes one: best/'s weights linked in."""
    out.root.mkdir(parents=True, exist_ok=True)
    best = BestModel(metrics={"eval/main": 0.5} if out.best_weights.is_file() else {})
    state = {"format": checkpoint.FORMAT, "run_id": None, "parts": {"best": best.state_dict()}}
    return checkpoint.save(out, step, state, rank=0, keep=10, files={"job.json": record().to_json()},
                           links={CheckpointFiles.BEST: out.best_weights})


def test_a_named_checkpoint_is_resumed_and_what_followed_it_is_undone(tmp_path):
    out = OutputDir(tmp_path / "out")
    saved(out, 10)  # before any evaluation: no best model yet
    best_saved(out, b"best at 15")
    saved(out, 20)
    best_saved(out, b"best at 25")  # after the checkpoint named
    saved(out, 30)
    start = decide(plan(out, out.checkpoint(20)))
    assert (start.checkpoint.path, start.checkpoint.step, start.named) == (out.checkpoint(20), 20, True)
    assert out.checkpoint(30).is_dir() and out.best_weights.read_bytes() == b"best at 25"  # nothing done yet
    start.rewind(SINGLE)
    assert [p.name for p in out.checkpoint_dirs()] == ["step-00000010", "step-00000020"]
    assert out.best_weights.read_bytes() == b"best at 15" and (out.best / "config.json").is_file()
    assert checkpoint.latest(out).step == 20  # its linked weights still match its manifest

    decide(plan(out, out.checkpoint(10))).rewind(SINGLE)  # a checkpoint that knows no best model
    assert not out.best.exists() and [p.name for p in out.checkpoint_dirs()] == ["step-00000010"]


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
    saved(out, 10)
    saved(other, 10)
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
