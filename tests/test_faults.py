"""Faults: kill and resume exactly, preemption, divergence, corrupted checkpoints."""
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import FAST, ROOT, assert_same_result, mlflow_runs, run_cli, wait_for
from pipeline import checkpoint
from pipeline.config import load_config
from pipeline.train import Diverged, run

# dropout stays on: a resume must restore every rank's RNG to continue bit-exactly
JOB = [*FAST, "train.epochs=2", "train.save_every=10", "train.log_every=5"]


def start_cli(*args, log):
    """The CLI in its own session (so a kill reaches all of it), output to a file."""
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    proc = start_cli("train", *JOB, f"output_dir={tmp / 'out'}", f"tracking.uri=sqlite:///{tmp}/m.db",
                     log=tmp / "log")
    assert proc.wait(timeout=600) == 0, (tmp / "log").read_text()[-2000:]
    return tmp / "out"


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_gives_identical_results(tmp_path, uninterrupted):
    out, db = tmp_path / "out", tmp_path / "m.db"
    proc = start_cli("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", log=tmp_path / "log")
    wait_for(lambda: (checkpoint.latest(out) or checkpoint.Checkpoint(None, 0)).step >= 30 or proc.poll() is not None,
             what="a checkpoint at step 30")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "metrics.json").exists()  # it really died mid-run

    result = run_cli("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", "resume=auto")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed from" in result.stderr
    assert_same_result(uninterrupted, out)
    (mlrun,) = mlflow_runs(db, "pipeline")  # the resumed job continued its own run
    assert mlrun.info.status == "FINISHED"


@pytest.mark.slow
def test_sigterm_saves_marks_the_run_killed_and_resume_finishes(tmp_path, uninterrupted):
    out, db = tmp_path / "out", tmp_path / "m.db"
    proc = start_cli("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", log=tmp_path / "log")
    wait_for(lambda: checkpoint.latest(out) is not None or proc.poll() is not None, what="first checkpoint")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, (tmp_path / "log").read_text()[-2000:]
    assert "preempted: SIGTERM: checkpoint" in (tmp_path / "log").read_text()
    saved = checkpoint.latest(out)
    assert saved.step > 10  # a fresh checkpoint at the step boundary after the signal
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "KILLED"

    result = run_cli("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", "resume=auto")
    assert result.returncode == 0, result.stderr[-2000:]
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FINISHED"
    assert_same_result(uninterrupted, out)


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
    out, db = tmp_path / "out", tmp_path / "m.db"
    cfg = load_config(None, [*FAST, "train.save_every=10", "train.max_nonfinite=3", f"output_dir={out}",
                             f"tracking.uri=sqlite:///{db}"])
    with pytest.raises(Diverged,
                       match="3 consecutive non-finite losses at step 15; last good checkpoint: .*step-00000010"):
        run(cfg)
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FAILED"
    assert checkpoint.latest(out).step == 10


def test_corrupted_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    for step in (5, 10):
        checkpoint.save(tmp_path, step, {"x": torch.tensor([step])}, rank=0, keep=3)
    newest = tmp_path / "checkpoints" / "step-00000010" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:-7])  # truncated
    half = tmp_path / "checkpoints" / ".step-00000015.tmp"  # a save that was killed
    half.mkdir()
    found = checkpoint.latest(tmp_path)
    assert found.step == 5 and found.load_state()["x"].item() == 5
    assert "step-00000010 is corrupted" in caplog.text


def test_only_the_newest_k_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, step, {"x": torch.tensor([step])}, rank=0, keep=2)
    assert [c.step for c in checkpoint.complete(tmp_path)] == [3, 4]


def test_checkpoints_refuse_pickled_code(tmp_path):
    checkpoint.save(tmp_path, 1, {"x": torch.tensor([1])}, rank=0, keep=1)
    ckpt = checkpoint.latest(tmp_path)
    torch.save({"evil": object()}, ckpt.path / "state.pt")  # not a weights-only payload
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    manifest["files"]["state.pt"] = checkpoint._sha256(ckpt.path / "state.pt")
    (ckpt.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        ckpt.load_state()


def start_torchrun(*args, log, max_restarts=0):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={max_restarts}", "-m", "pipeline", *map(str, args)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.fixture(scope="module")
def uninterrupted_ddp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted_ddp")
    proc = start_torchrun("train", *JOB, f"output_dir={tmp / 'out'}", f"tracking.uri=sqlite:///{tmp}/m.db",
                          log=tmp / "log")
    assert proc.wait(timeout=600) == 0, (tmp / "log").read_text()[-3000:]
    return tmp / "out"


@pytest.mark.slow
def test_ddp_sigkill_then_resume_gives_identical_results(tmp_path, uninterrupted_ddp):
    out, db = tmp_path / "out", tmp_path / "m.db"
    proc = start_torchrun("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", log=tmp_path / "log")
    wait_for(lambda: (checkpoint.latest(out) or checkpoint.Checkpoint(None, 0)).step >= 20 or proc.poll() is not None,
             what="a checkpoint at step 20")
    os.killpg(proc.pid, signal.SIGKILL)  # the agent and both workers
    proc.wait()
    assert not (out / "metrics.json").exists()
    resumed = start_torchrun("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", "resume=auto",
                             log=tmp_path / "log2")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "log2").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "log2").read_text()
    assert_same_result(uninterrupted_ddp, out)
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["world_size"] == "2"


@pytest.mark.slow
def test_elastic_restart_after_a_worker_is_killed_completes_in_the_same_run(tmp_path, uninterrupted_ddp):
    import psutil

    out, db = tmp_path / "out", tmp_path / "m.db"
    agent = start_torchrun("train", *JOB, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", log=tmp_path / "log",
                           max_restarts=1)
    wait_for(lambda: (checkpoint.latest(out) or checkpoint.Checkpoint(None, 0)).step >= 20 or agent.poll() is not None,
             what="a checkpoint at step 20")
    workers = [p for p in psutil.Process(agent.pid).children(recursive=True) if "pipeline" in " ".join(p.cmdline())]
    assert len(workers) == 2
    workers[1].kill()  # one worker dies; the agent restarts the group, which resumes
    assert agent.wait(timeout=600) == 0, (tmp_path / "log").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "log").read_text()
    assert_same_result(uninterrupted_ddp, out)
    (mlrun,) = mlflow_runs(db, "pipeline")  # the restarted workers continued the same run
    assert mlrun.info.status == "FINISHED"
