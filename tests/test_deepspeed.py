"""DeepSpeed on CPU (its CPU accelerator, gloo): ZeRO-3 in bf16 under the real deepspeed
launcher, close to DDP; exact resume through ZeRO-2 engine checkpoints; the
config's "auto" values and conflicts; and a two-node torchrun job simulated on loopback."""
import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import FAST, ROOT, assert_same_result, deepspeed, free_port, mlflow_runs, run_cli, torchrun, wait_for
from pipeline import checkpoint, names
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.runtime.deepspeed_backend import resolve_ds_config

JOB = [*FAST, "train.batch_size=16", "train.epochs=2"]


@pytest.fixture(scope="module")
def ddp_bf16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    result = torchrun(2, "train", *JOB, "precision=bf16", f"output_dir={tmp}", f"tracking.uri=sqlite:///{tmp}/m.db")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp / "metrics.json").read_text())


@pytest.mark.slow
def test_zero3_in_bf16_lands_close_to_ddp(tmp_path, ddp_bf16):
    # ZeRO-3, the stage that shards the parameters too; ZeRO-2 runs in the resume and KD tests
    stage = 3
    db = tmp_path / "m.db"
    code, out = deepspeed("train", *JOB, "precision=bf16", f"deepspeed=ds_configs/zero{stage}.json",
                          f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}", "tracking.experiment=ds")
    assert code == 0, out[-3000:]
    final = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert final[names.EVAL_MAIN] > 0.6  # it learned (chance is ~0.33)
    assert abs(final[names.EVAL_MAIN] - ddp_bf16[names.EVAL_MAIN]) < 0.1  # close to DDP, not equal
    resolved = json.loads((tmp_path / "out" / "deepspeed_config.json").read_text())
    assert resolved["zero_optimization"]["stage"] == stage and resolved["bf16"]["enabled"] is True
    assert resolved["train_micro_batch_size_per_gpu"] == 16 and resolved["train_batch_size"] == 32
    (mlrun,) = mlflow_runs(db, "ds")
    assert mlrun.data.tags["backend"] == "deepspeed" and mlrun.data.tags["world_size"] == "2"
    assert mlrun.data.tags["launcher"] == "deepspeed"
    assert {names.SKIPPED_STEPS, names.TRAIN_GRAD_NORM, names.EVAL_MAIN} <= set(mlrun.data.metrics)
    assert (tmp_path / "out" / "best" / "model.safetensors").is_file()  # consolidated from the shards


@pytest.mark.slow
def test_deepspeed_kill_and_resume_through_engine_checkpoints(tmp_path):
    job = [*FAST, "train.batch_size=16", "train.max_steps=40", "train.save_every=10", "deepspeed=ds_configs/zero2.json"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    code, log = deepspeed("train", *job, f"output_dir={ref}", f"tracking.uri=sqlite:///{tmp_path}/r.db")
    assert code == 0, log[-3000:]
    proc = deepspeed("train", *job, f"output_dir={out}", f"tracking.uri=sqlite:///{tmp_path}/m.db",
                     log=tmp_path / "log", wait=False)
    wait_for(lambda: (checkpoint.latest(out) or checkpoint.Checkpoint(None, 0)).step >= 20 or proc.poll() is not None,
             what="a checkpoint at step 20")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (checkpoint.latest(out).path / "engine").is_dir()  # DeepSpeed's own checkpoint inside ours
    code, log = deepspeed("train", *job, f"output_dir={out}", f"tracking.uri=sqlite:///{tmp_path}/m.db", "resume=auto")
    assert code == 0, log[-3000:]
    assert "resumed from" in log
    assert_same_result(ref, out)


def test_auto_values_are_filled_and_conflicts_named():
    cfg = load_config(None, ["train.batch_size=8", "train.grad_accum=2", "train.lr=3e-4"])
    raw = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
    resolved = resolve_ds_config(raw, cfg.train, "bf16", 4, "ds.json")
    assert resolved["train_batch_size"] == 64 and resolved["bf16"]["enabled"] is True
    assert resolved["fp16"]["enabled"] is False and resolved["optimizer"]["params"]["lr"] == 3e-4
    with pytest.raises(UserError, match=r"ds.json sets train_micro_batch_size_per_gpu=32 but train.batch_size=8"):
        resolve_ds_config({"train_micro_batch_size_per_gpu": 32}, cfg.train, "fp32", 1, "ds.json")
    with pytest.raises(UserError, match=r"ds.json sets bf16.enabled=true but precision=fp32"):
        resolve_ds_config({"bf16": {"enabled": True}}, cfg.train, "fp32", 1, "ds.json")


@pytest.mark.slow
@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"train_micro_batch_size_per_gpu": 99}', "sets train_micro_batch_size_per_gpu=99 but train.batch_size=32"),
])
def test_bad_deepspeed_configs_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    result = run_cli("train", *FAST, "backend=deepspeed", f"deepspeed={path}", f"output_dir={tmp_path / 'out'}",
                     f"tracking.uri=sqlite:///{tmp_path}/m.db")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert message in line and not (tmp_path / "m.db").exists()


@pytest.mark.slow
def test_fp16_under_deepspeed_on_cpu_is_refused(tmp_path, monkeypatch):
    result = run_cli("train", *FAST, "backend=deepspeed", "precision=fp16", f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert "fp16" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_two_node_torchrun_on_loopback_is_one_run_with_two_nodes(tmp_path):
    db = tmp_path / "m.db"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
         "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
         "-m", "pipeline", "train", *FAST, "train.max_steps=10", f"output_dir={tmp_path / 'out'}",
         f"tracking.uri=sqlite:///{db}", "tracking.experiment=nodes"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [a.communicate(timeout=600)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), outputs[0][-2000:] + outputs[1][-2000:]
    (mlrun,) = mlflow_runs(db, "nodes")
    assert mlrun.data.tags["world_size"] == "2" and mlrun.data.tags["num_nodes"] == "2"
    assert mlrun.info.status == "FINISHED"
