"""resume=auto continues the same job and never another: the tests that train a model or start a
process (the others are in tests/unit/test_same_job.py)."""
import os
import shutil
import signal

import pytest
import torch

from helpers import FAST, mlflow_runs, run_cli, tracking_db
from pipeline import job_record, models, names
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.job import loop as job_loop
from pipeline.job.parts import checkpoint
from pipeline.job.run import run
from pipeline.layout import OutputDir
from pipeline.tasks import get_task
from pipeline.tasks.samples import ensure_samples

SENTIMENT = get_task("sentiment", {})
ROWS = 320  # 10 optimizer steps an epoch at batch 32
PREEMPT_AT = 6  # SIGTERM after this step; the ranks agree one step later: a checkpoint at step 7


def preempted(monkeypatch, args: list[str], stage: str) -> None:
    """Run the job in this process and SIGTERM it after PREEMPT_AT steps, as a scheduler would."""
    real = job_loop.optimizer_step
    sent = []

    def step_then_term(loop, *a, **k):
        stop = real(loop, *a, **k)
        if loop.progress.step == PREEMPT_AT and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return stop

    monkeypatch.setattr(job_loop, "optimizer_step", step_then_term)
    with pytest.raises(job_loop.Preempted):
        run(load_config(None, args), stage)
    monkeypatch.undo()


def train_file(directory, rows=ROWS):
    source = ensure_samples("sentiment", SENTIMENT.write_samples)["train"]
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    path = directory / "train.tsv"
    path.write_text("".join(lines[: rows + 1]), encoding="utf-8")  # the header and ROWS rows
    return path


def local_model(directory, **config):
    """A model directory with its own (fixed) tokenizer, as a hub model is."""
    texts = [line.split("\t")[0] for line in train_file(directory).read_text(encoding="utf-8").splitlines()[1:]]
    tokenizer, model = models.build("preset:bangla-tiny", SENTIMENT, texts, config, 48)
    model.save_pretrained(directory / "model")
    tokenizer.save_pretrained(directory / "model")
    return directory / "model"


class Job:
    """A preempted job's folder (outputs and MLflow store), copied per test."""

    def __init__(self, root, args, stage="train"):
        self.root, self.base, self.stage = root, args, stage

    def args(self, *extra):
        return [*self.base, f"output_dir={self.root / 'out'}",
                f"tracking.uri=sqlite:///{tracking_db(self.root)}", "resume=auto", *extra]

    def copy(self, tmp_path):
        shutil.copytree(self.root, tmp_path / "job", symlinks=True)
        args = [a.replace(str(self.root), str(tmp_path / "job")) for a in self.base]
        return Job(tmp_path / "job", args, self.stage)

    def resume(self, *extra):
        return run(load_config(None, self.args(*extra)), self.stage)

    def untouched_by(self, *extra) -> str:
        """The UserError of a refused resume, checked to have changed nothing on disk or in MLflow."""
        before = sorted(str(p) for p in (self.root / "out").rglob("*"))
        (run,) = mlflow_runs(tracking_db(self.root), "pipeline")
        with pytest.raises(UserError) as refused:
            self.resume(*extra)
        assert sorted(str(p) for p in (self.root / "out").rglob("*")) == before
        (after,) = mlflow_runs(tracking_db(self.root), "pipeline")
        assert (after.info.status, after.info.end_time) == ("KILLED", run.info.end_time)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"resume: checkpoint {self.root / 'out'}")
        return message


def make_job(root, monkeypatch, args, stage="train"):
    root.mkdir(parents=True, exist_ok=True)
    made = Job(root, args, stage)
    preempted(monkeypatch, made.args()[:-1], stage)  # not resume=auto: a fresh job
    assert checkpoint.latest(OutputDir(root / "out")).step == PREEMPT_AT + 1
    return made


@pytest.fixture(scope="module")
def preset_job(tmp_path_factory):
    """The preset's tokenizer is trained on the training file (as the demo's is)."""
    root = tmp_path_factory.mktemp("preset")
    with pytest.MonkeyPatch.context() as mp:
        return make_job(root, mp, [*FAST, f"data.train={train_file(root)}",
                                   "data.dev=samples", "data.test=samples", "train.epochs=2", "train.save_every=4"])


@pytest.fixture(scope="module")
def local_job(tmp_path_factory):
    """A model directory with a fixed tokenizer, as a hub model is."""
    root = tmp_path_factory.mktemp("local")
    with pytest.MonkeyPatch.context() as mp:
        return make_job(root, mp, [*FAST, f"model={local_model(root)}", f"data.train={train_file(root)}",
                                   "data.dev=samples", "data.test=samples",
                                   "train.epochs=2", "train.save_every=4"])


# ------------------------------------------------------------------ refused, in one line


@pytest.mark.slow
def test_a_changed_learning_rate_is_refused_naming_the_key_both_values_and_the_ways_on(preset_job, tmp_path):
    j = preset_job.copy(tmp_path)
    message = j.untouched_by("train.lr=1e-2")
    assert "trained with other settings: train.lr: 0.001 -> 0.01." in message
    assert "resume=never overwrite=true starts over" in message and "accept_changes=train.lr continues" in message

    result = run_cli("train", *j.args("train.lr=1e-2"))  # the user's command: exit 2, one line
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {message}"


@pytest.mark.slow
def test_appended_training_rows_are_refused_naming_the_file_and_both_fingerprints(preset_job, tmp_path):
    j = preset_job.copy(tmp_path)
    data = tmp_path / "job" / "train.tsv"
    old = "sha256:" + checkpoint_job(j).data["train"]["fingerprint"].split(":")[1][:12]
    with data.open("a", encoding="utf-8") as f:
        f.write("নতুন একটি বাক্য\tPositive\n")
    message = j.untouched_by()
    assert f"data.train: {data} changed (fingerprint {old} -> sha256:" in message


@pytest.mark.slow
def test_with_a_fixed_tokenizer_changed_data_is_refused_too(local_job, tmp_path):
    j = local_job.copy(tmp_path)
    with (tmp_path / "job" / "train.tsv").open("a", encoding="utf-8") as f:
        f.write("নতুন একটি বাক্য\tPositive\n")
    assert "data.train: " in j.untouched_by()


@pytest.mark.slow
def test_a_model_directory_replaced_by_another_architecture_is_refused(local_job, tmp_path):
    j = local_job.copy(tmp_path)
    shutil.rmtree(tmp_path / "job" / "model")
    local_model(tmp_path / "job", intermediate_size=256)
    message = j.untouched_by()
    assert "the model no longer matches it (intermediate_size 512 -> 256)" in message


@pytest.mark.slow
def test_a_teacher_that_changed_under_its_student_is_refused(local_job, tmp_path, monkeypatch):
    teacher = local_job.copy(tmp_path).root / "model"
    student = make_job(tmp_path / "student", monkeypatch, [
        *FAST, f"data.train={local_job.root / 'train.tsv'}", "data.dev=samples", "data.test=samples",
        "train.epochs=2", "train.save_every=4",
        f"kd.teacher={teacher}", "model=from_teacher:1"], stage="distill")
    model = SENTIMENT.model_class.from_pretrained(teacher)
    with torch.no_grad():
        model.classifier.bias.add_(1.0)  # retrained: same architecture, other weights
    model.save_pretrained(teacher)
    assert "trained with other settings: kd.teacher: changed (sha256:" in student.untouched_by()


# ------------------------------------------------------------------ what may change


@pytest.mark.slow
def test_safe_keys_and_the_split_of_the_global_batch_may_change(preset_job, tmp_path):
    j = preset_job.copy(tmp_path)
    final = j.resume("train.batch_size=16", "train.grad_accum=2", "train.log_every=3", "train.keep_checkpoints=3",
                     "tracking.run_name=renamed", "train.eval_batch_size=8")
    assert final[names.TRAIN_STEPS] == 20
    (run,) = mlflow_runs(tracking_db(j.root), "pipeline")
    assert run.info.status == "FINISHED" and names.TAG_RESUMED_WITH_CHANGES not in run.data.tags


@pytest.mark.slow
def test_accepted_changes_continue_and_the_run_says_it_mixes_two_settings(preset_job, tmp_path, caplog):
    j = preset_job.copy(tmp_path)
    final = j.resume("train.lr=1e-2", "model_config.hidden_dropout_prob=0",
                     "accept_changes=train.lr,model_config.hidden_dropout_prob")
    assert final[names.TRAIN_STEPS] == 20
    (run,) = mlflow_runs(tracking_db(j.root), "pipeline")
    assert run.info.status == "FINISHED"
    assert run.data.tags[names.TAG_RESUMED_WITH_CHANGES] == (
        "model_config.hidden_dropout_prob: (unset) -> 0 (at step 7) | train.lr: 0.001 -> 0.01 (at step 7)")
    assert run.data.params[f"resumed_at_step_{PREEMPT_AT + 1}.train.lr"] == "0.001 -> 0.01"
    assert run.data.params["train.lr"] == "0.001"  # MLflow keeps the first value: the tag and param say the rest
    assert ("continuing with changed settings (accept_changes): model_config.hidden_dropout_prob: (unset) -> 0; "
            "train.lr: 0.001 -> 0.01") in caplog.text


@pytest.mark.slow
def test_a_finished_job_is_not_extended_and_says_how_to_train_on(preset_job, tmp_path, caplog):
    j = preset_job.copy(tmp_path)
    final = j.resume()
    assert j.resume() == pytest.approx(final, nan_ok=True)  # the same job again: nothing to do
    out = j.root / "out"
    with pytest.raises(UserError) as refused:
        j.resume("train.epochs=3")
    assert str(refused.value) == (
        f"resume: {out} holds a finished job (train.epochs: 2 -> 3): a finished job is not extended (its "
        f"learning rate has decayed to zero); to train on from its best model, model={out / 'best'} with another "
        "output_dir")
    with pytest.raises(UserError, match=r"holds a finished job trained with other settings: train\.lr: 0\.001"):
        j.resume("train.lr=1e-2")


def checkpoint_job(j):
    return job_record.read(checkpoint.latest(OutputDir(j.root / "out")).job)
