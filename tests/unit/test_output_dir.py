"""An output_dir never eats another job's work: default directories name the model (and a distill's
teacher); a job that would start over on another job's finished outputs or checkpoints is refused in
one line naming what differs, unless overwrite=true; the same finished job asked for again keeps its outputs."""
from types import SimpleNamespace

import pytest

from helpers import settled_config
from pipeline.config import load_config
from pipeline.config.output_dir import model_slug
from pipeline.errors import UserError
from pipeline.fsutil import write_json
from pipeline.job.plan import settle_config
from pipeline.job.resume import decide
from pipeline.job_record import JobRecord
from pipeline.layout import OutputDir
from pipeline.runtime import compiler
from pipeline.tasks import get_task


@pytest.mark.parametrize("spec, slug", [
    ("preset:bangla-tiny", "bangla-tiny"), ("csebuetnlp/banglabert", "banglabert"),
    ("/data/outputs/wikiqa-teacher/best", "wikiqa-teacher"), ("outputs/x/best/", "x"), ("from_teacher:4", "student4"),
    ("from_teacher:", "student"), ("/models/my model@v2", "my-model-v2"),
])
def test_a_model_spec_becomes_a_directory_name(spec, slug):
    assert model_slug(spec) == slug


def test_default_output_dirs_of_other_models_or_teachers_differ_and_a_given_one_stays():
    cfg = load_config(None, ["task=sentiment", "precision=bf16"])
    task = get_task("sentiment")
    tiny, small = (settled_config(cfg, m, task).output_dir for m in ("preset:bangla-tiny", "preset:bangla-small"))
    assert (tiny, small) == ("outputs/sentiment-bangla-tiny-bf16", "outputs/sentiment-bangla-small-bf16")
    off = compiler.resolve("off", "cpu", "single")
    distilled = settle_config(cfg, "from_teacher:4", task, "cpu", off, teacher="outputs/sentiment-teacher/best")
    assert distilled.output_dir == "outputs/sentiment-student4-bf16-kd-sentiment-teacher"
    given = load_config(None, ["output_dir=/scratch/run1"])
    assert settled_config(given, "preset:bangla-tiny", task).output_dir == "/scratch/run1"


def record(**config) -> JobRecord:
    data = {"train": {"file": "t", "fingerprint": "sha256:aa"}, "dev": {"file": "d", "fingerprint": "sha256:bb"}}
    return JobRecord(config={"task": "sentiment", "model": "preset:bangla-tiny", "train.lr": 3e-4, "resume": "never",
                             **config}, global_batch="16 rows", world_size=1, backend="torch", precision="fp32",
                     data=data)


def plan(out, asked: JobRecord, overwrite=False):
    return SimpleNamespace(cfg=SimpleNamespace(overwrite=overwrite, resume="never"), out=OutputDir(out), record=asked)


def finished(out, held: JobRecord | None):
    out.mkdir()
    write_json(out / "metrics.json", {"test/main": 0.5})
    if held is not None:
        write_json(out / "job.json", held.to_json())


def test_another_finished_job_is_refused_in_one_line_naming_each_difference(tmp_path):
    out = tmp_path / "out"
    finished(out, record())
    asked = record(model="preset:bangla-small", **{"train.lr": 1e-4, "train.log_every": 5})  # log_every: safe
    with pytest.raises(UserError) as e:
        decide(plan(out, asked))
    message = str(e.value)
    assert message == (f"output_dir {out} holds another job's finished outputs (train.lr: 0.0003 -> 0.0001; "
                       "model: preset:bangla-tiny -> preset:bangla-small): another output_dir keeps both; "
                       "overwrite=true removes them and starts this job there")
    assert "\n" not in message and (out / "metrics.json").is_file()  # nothing touched


def test_the_same_finished_job_is_kept_overwrite_starts_over_and_unrecorded_outputs_are_refused(tmp_path):
    out = tmp_path / "out"
    finished(out, record())
    again = decide(plan(out, record(**{"tracking.experiment": "x"})))  # the same job's command again
    assert again.finished and again.metrics == {"test/main": 0.5}  # run() says so and keeps best/ and metrics
    assert not decide(plan(out, record(), overwrite=True)).finished  # overwrite=true trains it anew
    assert not decide(plan(out, record(model="preset:bangla-small"), overwrite=True)).finished
    assert not decide(plan(tmp_path / "empty", record())).finished
    unrecorded = tmp_path / "old"
    finished(unrecorded, None)
    with pytest.raises(UserError, match=r"holds another job's finished outputs \(no record of its job"):
        decide(plan(unrecorded, record()))


def test_another_jobs_checkpoints_are_refused_too(tmp_path):
    out = OutputDir(tmp_path / "out")
    ckpt = out.checkpoint(10)
    ckpt.mkdir(parents=True)
    write_json(ckpt / "manifest.json", {"step": 10, "files": {}})
    write_json(ckpt / "job.json", record().to_json())
    with pytest.raises(UserError, match=r"holds another job's checkpoints \(precision: fp32 -> bf16\)"):
        decide(plan(out, JobRecord(**{**record().to_json(), "precision": "bf16"})))
