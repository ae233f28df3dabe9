"""Faults: the tests that train a model or start a process (the others are in
tests/unit/test_faults.py)."""
import logging
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers import FAST, ROOT, assert_same_result, free_port, mlflow_runs, run_cli, tracking_db, wait_for
from pipeline import cli, names
from pipeline.config import load_config
from pipeline.job.parts import checkpoint
from pipeline.job.parts.step_losses import Diverged
from pipeline.job.resume import Resume
from pipeline.job.run import run
from pipeline.layout import OutputDir
from pipeline.runtime.world import Runtime
from pipeline.tracking import Tracker, sync

SINGLE = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
# dropout stays on: a resume must restore every rank's RNG to continue bit-exactly. train/loss is
# logged only at the end, so its window spans every kill below: it must survive in the checkpoint
JOB = [*FAST, "train.epochs=2", "train.save_every=10", "train.log_every=1000"]
EVALUATING_JOB = [*JOB, "train.eval_every=15", "train.keep_checkpoints=10"]
"""JOB with dev evaluated between steps too (a resume crosses evaluations made mid-epoch), and
checkpoints kept to resume from by name."""
STEPS_PER_EPOCH = 75  # 2400 samples, batch 32, one process
STEPS_PER_EPOCH_DDP = 38  # 1200 samples a rank under 2-process DDP


def start_cli(*args, log):
    """The CLI in its own session (so a kill reaches all of it), output to a file."""
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def newest_step(out):
    return (checkpoint.latest(OutputDir(out)) or checkpoint.Checkpoint(None, 0)).step


def finished_without_a_fault(tmp: Path, start, job: list[str] = JOB) -> Path:
    """`job` launched by `start` (start_cli, start_torchrun) and left to finish: its output_dir."""
    proc = start("train", *job, f"output_dir={tmp / 'out'}", f"tracking.uri=sqlite:///{tracking_db(tmp)}",
                 log=tmp / "log")
    assert proc.wait(timeout=600) == 0, (tmp / "log").read_text()[-3000:]
    return tmp / "out"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return finished_without_a_fault(tmp_path_factory.mktemp("uninterrupted"), start_cli, EVALUATING_JOB)


@pytest.mark.slow
def test_preempted_then_killed_then_resumed_from_a_named_checkpoint_gives_identical_results(tmp_path,
                                                                                          uninterrupted):
    """A preemptible job's life: SIGTERM saves at the next step boundary and marks the run KILLED;
    the resumed job is SIGKILLed in the second epoch after an evaluation between steps (no save,
    its lock left behind); the next job resumes from an earlier checkpoint by name (resume=PATH),
    undoes what followed it, best/ included, takes the lock over and finishes the same MLflow run
    with the uninterrupted job's figures, bit for bit."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    job = [*EVALUATING_JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}"]
    proc = start_cli("train", *job, log=tmp_path / "log")
    wait_for(lambda: newest_step(out) >= 10 or proc.poll() is not None, what="a first checkpoint")
    before = newest_step(out)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, (tmp_path / "log").read_text()[-2000:]
    assert "preempted: SIGTERM: checkpoint" in (tmp_path / "log").read_text()
    assert newest_step(out) > before  # a fresh checkpoint at the step boundary after the signal
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "KILLED"

    proc = start_cli("train", *job, "resume=auto", log=tmp_path / "log2")
    wait_for(lambda: newest_step(out) >= STEPS_PER_EPOCH + 25 or proc.poll() is not None,
             what="a checkpoint after an evaluation in the second epoch")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log2 = (tmp_path / "log2").read_text()
    assert "resumed from" in log2 and "step 90  dev " in log2
    assert not (out / "metrics.json").exists()  # it really died mid-run

    named = max(c.step for c in checkpoint.complete(OutputDir(out)) if c.step <= STEPS_PER_EPOCH + 10)
    result = run_cli("train", *job, f"resume={OutputDir(out).checkpoint(named)}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed from" in result.stderr and "undoing what the job did after it" in result.stderr
    assert "taking over the lock of a job that ended without releasing it" in result.stderr
    assert_same_result(uninterrupted, out)
    (mlrun,) = mlflow_runs(db, "pipeline")  # every resume continued the job's own run
    assert mlrun.info.status == "FINISHED"


@pytest.mark.slow
def test_consecutive_nonfinite_losses_stop_with_a_clear_error(tmp_path, monkeypatch):
    import transformers

    original = transformers.BertForSequenceClassification.forward
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):  # the loss itself turns NaN from the 13th training batch on
        out = original(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 12:
                out.loss = out.loss * math.nan
        return out

    monkeypatch.setattr(transformers.BertForSequenceClassification, "forward", poisoned)
    out, db = tmp_path / "out", tracking_db(tmp_path)
    cfg = load_config(None, [*FAST, "train.save_every=10", "train.max_nonfinite=3", f"output_dir={out}",
                             f"tracking.uri=sqlite:///{db}"])
    with pytest.raises(Diverged,
                       match="3 consecutive non-finite losses at step 15; last good checkpoint: .*step-00000010"):
        run(cfg)
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FAILED"
    assert checkpoint.latest(OutputDir(out)).step == 10


def start_torchrun(*args, log, max_restarts=0):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={max_restarts}", "-m", "pipeline", *map(str, args)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_all(agent):
    """SIGKILL torchrun's agent and its workers, each of which it starts in a session of its own
    (a kill of the agent's process group leaves them training)."""
    import psutil

    procs = [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]
    for p in procs:
        p.kill()
    psutil.wait_procs(procs, timeout=60)
    agent.wait()


@pytest.fixture(scope="module")
def uninterrupted_ddp(tmp_path_factory):
    return finished_without_a_fault(tmp_path_factory.mktemp("uninterrupted_ddp"), start_torchrun)


@pytest.mark.slow
def test_a_worker_killed_then_the_whole_job_killed_resumes_to_identical_results(tmp_path, uninterrupted_ddp):
    """Two-process DDP under torchrun, two faults: one worker dies in the first epoch and the elastic
    agent (--max-restarts=1) restarts the group, which resumes within the same MLflow run; then the
    agent and both workers are SIGKILLed in the second epoch, and a new torchrun with resume=auto
    finishes with the uninterrupted job's figures."""
    import psutil

    out, db = tmp_path / "out", tracking_db(tmp_path)
    job = [*JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}"]
    agent = start_torchrun("train", *job, log=tmp_path / "log", max_restarts=1)
    wait_for(lambda: newest_step(out) >= 10 or agent.poll() is not None, what="a first checkpoint")
    workers = [p for p in psutil.Process(agent.pid).children(recursive=True) if "pipeline" in " ".join(p.cmdline())]
    assert len(workers) == 2
    workers[1].kill()  # one worker dies; the agent restarts the group, which resumes
    wait_for(lambda: newest_step(out) > 38 or agent.poll() is not None, what="a checkpoint in the second epoch")
    kill_all(agent)
    assert "resumed from" in (tmp_path / "log").read_text()
    assert not (out / "metrics.json").exists()

    resumed = start_torchrun("train", *job, "resume=auto", log=tmp_path / "log2")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "log2").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "log2").read_text()
    assert_same_result(uninterrupted_ddp, out)
    (mlrun,) = mlflow_runs(db, "pipeline")  # the restarted group and the new job continued one run
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["world_size"] == "2"


@pytest.mark.slow
def test_a_two_process_job_killed_mid_epoch_resumes_on_one_process_at_the_same_rows(tmp_path, caplog):
    """The fallback after a lost device: a 2-process DDP job is SIGKILLed after a checkpoint in its
    first epoch and resumed by one plain process with requested_world_size=2 (grad_accum 2, the
    same global batch), here this test's process. The position is kept in optimizer steps, so the
    first epoch still ends after its 38 steps (evaluated at step 38, as the uninterrupted job is)
    and the job at 76."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    job = [*JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}"]
    agent = start_torchrun("train", *job, log=tmp_path / "log")
    wait_for(lambda: newest_step(out) >= 10 or agent.poll() is not None, what="a first checkpoint")
    kill_all(agent)
    assert 10 <= newest_step(out) < 38

    caplog.set_level(logging.INFO, logger="pipeline")
    run(load_config(None, [*job, "resume=auto", "requested_world_size=2"]))
    assert "train.grad_accum 1 -> 2 keeps the global batch of 2 processes" in caplog.text
    assert "resumed from" in caplog.text
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["world_size"] == "1"
    history = MlflowClient(f"sqlite:///{db}").get_metric_history(mlrun.info.run_id, names.eval_metric("macro_f1"))
    assert sorted(m.step for m in history) == [STEPS_PER_EPOCH_DDP, 2 * STEPS_PER_EPOCH_DDP]


# ---------------------------------------------------------------------- a finished job, a lost one


@pytest.mark.slow
def test_resume_auto_on_a_finished_job_does_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    out, db = tmp_path / "out", tracking_db(tmp_path)
    job = [*FAST, "train.max_steps=10", "train.save_every=5", f"output_dir={out}", f"tracking.uri=sqlite:///{db}"]
    figures = run(load_config(None, job))
    (done,) = mlflow_runs(db, "pipeline")
    journal = (out / "journal.jsonl").read_bytes()
    metrics_written = (out / "metrics.json").stat().st_mtime_ns

    again = run(load_config(None, [*job, "resume=auto"]))
    assert again == pytest.approx(figures, nan_ok=True)
    assert "this job finished before" in caplog.text and "resumed from" not in caplog.text
    assert (out / "journal.jsonl").read_bytes() == journal  # not reopened, nothing logged
    assert (out / "metrics.json").stat().st_mtime_ns == metrics_written
    (run_after,) = mlflow_runs(db, "pipeline")
    assert run_after.info.status == "FINISHED" and run_after.info.end_time == done.info.end_time
    assert run_after.data.metrics == done.data.metrics


@pytest.mark.slow
def test_no_usable_checkpoint_starts_over_says_so_and_supersedes_the_lost_run(tmp_path, caplog):
    """The job SIGKILLed with every checkpoint then corrupted; the next job (in this process) starts over."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    proc = start_cli("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", log=tmp_path / "log")
    wait_for(lambda: len(checkpoint.complete(OutputDir(out))) == 2 or proc.poll() is not None, what="two checkpoints")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for ckpt in checkpoint.complete(OutputDir(out)):  # every checkpoint corrupted
        state = ckpt.path / "state.pt"
        state.write_bytes(state.read_bytes()[:-7])
    (lost,) = mlflow_runs(db, "pipeline")
    assert lost.info.status == "RUNNING"

    caplog.set_level(logging.INFO, logger="pipeline")
    run(load_config(None, [*FAST, "train.max_steps=10", f"output_dir={out}", f"tracking.uri=sqlite:///{db}",
                           "resume=auto"]))
    assert f"resume=auto: no usable checkpoint in {out}; starting over (removing checkpoints)" in caplog.text
    assert (f"the previous job's MLflow run {lost.info.run_id} never ended: synced from its journal and marked "
            "FAILED") in caplog.text
    # one run per job in the default view: the lost run, FAILED, is superseded by the new one
    (new,) = mlflow_runs(db, "pipeline")
    old = MlflowClient(f"sqlite:///{db}").get_run(lost.info.run_id)
    assert new.info.status == "FINISHED" and new.data.tags[names.TAG_SUPERSEDES] == lost.info.run_id
    assert old.info.status == "FAILED" and old.info.lifecycle_stage == "deleted"
    assert old.data.tags[names.TAG_SUPERSEDED_BY] == new.info.run_id
    # no corrupted checkpoint of the lost job kept (10 steps: none saved)
    assert not checkpoint.complete(OutputDir(out))


@pytest.mark.slow  # creates and migrates a new MLflow store
def test_a_lost_job_that_never_reached_mlflow_is_uploaded_when_the_next_starts_over(tmp_path, caplog, monkeypatch):
    """The first job ran with its tracking server down (figures in the journal only) and died
    with no usable checkpoint. The job that starts over in its output_dir uploads that journal as
    a FAILED run before writing its own; with the store unreachable too, the journal is kept
    aside for `pipeline sync FILE` rather than overwritten."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the dead server: no retries to wait out
    out, db = tmp_path / "out", tracking_db(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    lost = Tracker(out, active=True)
    lost.start(dead, "lost", "first-job", {"task": "sentiment"}, {"train.lr": 0.001})
    lost.log_metrics({"train/loss": 1.1}, step=5)
    lost.log_metrics({"train/loss": 0.7}, step=10)  # then killed: no end record

    caplog.set_level(logging.WARNING, logger="pipeline")
    Resume(OutputDir(out), auto=True).start_over(SINGLE, f"sqlite:///{db}")
    (run,) = mlflow_runs(db, "lost")
    assert run.info.status == "FAILED" and run.data.params["train.lr"] == "0.001"
    assert [m.value for m in MlflowClient(f"sqlite:///{db}").get_metric_history(run.info.run_id, "train/loss")] \
        == [1.1, 0.7]
    assert f"MLflow run {run.info.run_id} never ended: synced from its journal and marked FAILED" in caplog.text

    again = tmp_path / "again"
    Tracker(again, active=True).start(dead, "lost", "second-job", {}, {})
    Resume(OutputDir(again), auto=True).start_over(SINGLE, dead)
    (kept,) = again.glob("journal.abandoned-*.jsonl")
    assert not (again / "journal.jsonl").exists() and f"python -m pipeline sync {kept}" in caplog.text
    assert run_cli("sync", kept, "--uri", f"sqlite:///{db}").returncode == 0
    assert {r.info.run_name: r.info.status for r in mlflow_runs(db, "lost")} == {"first-job": "FAILED",
                                                                                 "second-job": "FAILED"}


@pytest.mark.slow  # an MLflow store and two refused connections, over 2 s
def test_a_journal_torn_by_a_kill_mid_append_still_syncs_its_whole_lines(tmp_path, monkeypatch):
    """SIGKILL during an append leaves half a JSON line at the end of the journal. The resumed
    job's next record starts on a fresh line, and sync uploads every whole record."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    out, db = tmp_path / "out", tracking_db(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    first = Tracker(out, active=True)
    first.start(dead, "torn", "job", {}, {"train.lr": 0.001})
    first.log_metrics({"train/loss": 1.1}, step=5)
    with (out / "journal.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"type": "metrics", "step": 10, "metrics": {"train/lo')  # the kill
    resumed = Tracker(out, active=True, resume=True)
    resumed.start(dead, "torn", "job", {}, {"train.lr": 0.001})
    resumed.log_metrics({"train/loss": 0.5}, step=15)
    resumed.end("FINISHED")
    assert sync(out, f"sqlite:///{db}")
    (run,) = mlflow_runs(db, "torn")
    history = MlflowClient(f"sqlite:///{db}").get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(5, 1.1), (15, 0.5)] and run.info.status == "FINISHED"


@pytest.mark.slow  # a job trained to its first checkpoint, then Ctrl-C
def test_ctrl_c_of_a_job_is_one_line_naming_its_last_checkpoint_and_its_run_ends_killed(tmp_path):
    """Ctrl-C as a terminal sends it: SIGINT to the job's whole process group."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    args = [*JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}"]
    proc = start_cli("train", *args, log=tmp_path / "log")
    wait_for(lambda: checkpoint.complete(OutputDir(out)) or proc.poll() is not None, what="a checkpoint")
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130, (tmp_path / "log").read_text()[-3000:]
    log = (tmp_path / "log").read_text()
    ckpt = checkpoint.complete(OutputDir(out))[-1]
    assert log.strip().splitlines()[-1] == (
        f"interrupted: {ckpt.path} (step {ckpt.step}) is the last checkpoint; to continue: python -m pipeline "
        f"train {' '.join(args)} resume=auto")
    assert "Traceback" not in log
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "KILLED"


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_is_one_line_and_the_run_ends_failed(tmp_path, monkeypatch, capsys):
    """The disk fills from outside during training: from then on the journal's writes go to
    /dev/full, which fails them with a real ENOSPC (no root mount for a small disk in a test)."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    real_open, opened = Path.open, []

    def journal_on_a_full_disk(self, *args, **kwargs):
        if self.name == "journal.jsonl":
            opened.append(self)
            if len(opened) > 12:  # past the start of the run, into training
                return real_open(Path("/dev/full"), *args, **kwargs)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", journal_on_a_full_disk)
    code = cli.main(["train", *FAST, "train.max_steps=30", "train.log_every=2", f"output_dir={out}",
                     f"tracking.uri=sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    # the free space is the disk's, which other processes change while the test runs
    assert re.fullmatch(re.escape(f"error: no space left on device: writing {out / 'journal.jsonl'} (")
                        + r"\d+" + re.escape(" MiB free there); free some space and run again with resume=auto"),
                        err.strip().splitlines()[-1]), err[-2000:]
    assert "Traceback" not in err
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FAILED"  # not left RUNNING although the journal could not say so
