"""Knowledge distillation: the tests that train a model or start a process (the others are in
tests/unit/test_distill.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import FAST, ROOT, deepspeed, error_lines, free_port, mlflow_runs, run_cli, torchrun, tracking_db
from pipeline import names, predictions
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.fsutil import cache_root
from pipeline.job.run import run
from pipeline.tasks import get_task
from unit.test_distill import CPU, make_distiller  # noqa: F401


@pytest.mark.slow  # three teacher passes, over 2 s
def test_teacher_logit_cache_hits_misses_and_invalidates():
    from pipeline import models

    task = get_task("sentiment")
    examples = task.load(None, "train")[:96]
    tokenizer, teacher = models.build("preset:bangla-tiny", task, task.texts(task.load(None, "train")), {}, 48)
    features = task.featurize(examples, tokenizer, 48, "train")
    collate = task.collator(tokenizer)

    first = make_distiller(teacher)
    first.prepare(features, collate, 48, tokenizer)
    assert first.cache_hit is False and first.cached["logits"].dtype == torch.float16
    assert first.cached["logits"].shape == (96, 3)
    with torch.inference_mode():  # the cache holds what the teacher says, in fp16
        batch = collate([features[i] for i in range(4)])
        batch.pop("idx")
        live = teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits
    assert torch.allclose(first.cached["logits"][:4].float(), live, atol=1e-2)

    again = make_distiller(teacher)
    again.prepare(features, collate, 48, tokenizer)
    assert again.cache_hit is True

    fewer = task.featurize(examples[:95], tokenizer, 48, "train")  # another dataset
    other_data = make_distiller(teacher)
    other_data.prepare(fewer, collate, 48, tokenizer)
    assert other_data.cache_hit is False

    with torch.no_grad():
        teacher.classifier.bias.add_(0.01)  # another teacher
    other_teacher = make_distiller(teacher)
    other_teacher.prepare(features, collate, 48, tokenizer)
    assert other_teacher.cache_hit is False


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("teacher")
    run(load_config(None, [*FAST, "model=preset:bangla-small", "train.epochs=1", f"output_dir={tmp}",
                           f"tracking.uri=sqlite:///{tracking_db(tmp)}"]))
    return tmp


def two_node_job(tmp_path, args, caches) -> list[subprocess.CompletedProcess]:
    """A 2-node torchrun job on this machine (one worker per node, static rendezvous): each node
    has its own PIPELINE_CACHE, as a node-local ~/.cache would be."""
    port, procs = free_port(), []
    for node, cache in enumerate(caches):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "pipeline", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PIPELINE_CACHE": str(cache)}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = [p.communicate(timeout=600) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs)]


@pytest.mark.slow
def test_distill_on_two_nodes_splits_the_teacher_pass_and_learns(tmp_path, teacher_dir, monkeypatch):
    """One process fills node 0's cache; then a 2-node torchrun job on loopback (two agents of one
    worker each, one MLflow run for both nodes) whose node 1 has an empty cache:
    every rank computes its share (one missing node makes all compute), node 1 writes its own copy,
    and that copy holds what the single process computed (to fp16 rounding). The 2-process
    student then learns from the cached logits (KD under DDP; the loss is checked in this file)."""
    job = [*FAST, "model=from_teacher:2", f"kd.teacher={teacher_dir}"]
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    monkeypatch.setenv("PIPELINE_CACHE", str(node0))
    one_db = tracking_db(tmp_path, "1.db")
    run(load_config(None, [*job, "train.max_steps=2", f"output_dir={tmp_path / 'one'}",
                           f"tracking.uri=sqlite:///{one_db}"]), kind="distill")  # the pass covers every row
    (single,) = (cache_root() / "teacher_logits").glob("*/logits.safetensors")

    db = tracking_db(tmp_path, "2.db")
    nodes = two_node_job(tmp_path, ["distill", *job, "train.epochs=2", f"output_dir={tmp_path / 'two'}",
                                    f"tracking.uri=sqlite:///{db}", "tracking.experiment=split"], [node0, node1])
    assert [n.returncode for n in nodes] == [0, 0], nodes[0].stderr[-3000:] + nodes[1].stderr[-3000:]
    assert "split across 2 ranks" in nodes[0].stderr
    final = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert final[names.TEST_MAIN] > 0.5  # chance is ~0.33 macro-F1 (one epoch gave 0.51-0.7 across fresh caches)
    (mlrun,) = mlflow_runs(db, "split")
    assert mlrun.data.tags[names.TAG_KD_CACHE] == "miss"  # node 0 alone would have hit
    assert mlrun.data.tags["stage"] == "distill" and mlrun.data.tags["world_size"] == "2"
    assert mlrun.data.tags["num_nodes"] == "2" and mlrun.info.status == "FINISHED"  # two nodes, one run
    assert mlrun.data.params["kd.alpha"] == "0.5"
    split = node1 / single.relative_to(node0)  # the same key: the same features and teacher
    from safetensors.torch import load_file

    a, b = load_file(single), load_file(split)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    for k in a:
        torch.testing.assert_close(b[k].float(), a[k].float(), rtol=2**-10, atol=2**-14)


@pytest.mark.slow  # its teacher_dir trains a teacher
def test_tokenizer_mismatch_is_refused_at_start(tmp_path, teacher_dir):
    cfg = load_config(None, [*FAST, "model=sentence-transformers/all-MiniLM-L6-v2", f"kd.teacher={teacher_dir}",
                             f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    with pytest.raises(UserError, match="its tokenizer differs from the student's"):
        run(cfg, kind="distill")
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_distill_needs_a_teacher(tmp_path):
    result = run_cli("distill", *FAST, f"output_dir={tmp_path / 'out'}")  # the CLI path: exit 2, one line
    assert result.returncode == 2 and error_lines(result) == [
        "error: config: kd.teacher: required by distill (a train stage's output_dir, hub id or local model)"]


@pytest.mark.slow
def test_distill_with_every_term_under_torchrun_and_deepspeed_logs_each_by_name(tmp_path, teacher_dir):
    """A 2-layer student half the width of its 4-layer teacher, every term on (uniform layer map
    1:2,2:4, a projection per mapped layer), under torchrun with 2 processes (DDP) and under the
    deepspeed launcher with ZeRO-2: each term is logged by name, and best/ is a plain student."""
    job = ["distill", *FAST, "model=preset:bangla-tiny", f"kd.teacher={teacher_dir}", "kd.hidden_weight=1.0",
           "kd.attention_weight=1.0", "train.max_steps=2", "train.batch_size=16", "train.eval_batch_size=128"]
    from safetensors.torch import load_file

    from pipeline.tracking.journal import read_journal

    ddp = torchrun(2, *job, f"output_dir={tmp_path / 'ddp'}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    code, log = deepspeed(*job, "deepspeed=ds_configs/zero2.json", f"output_dir={tmp_path / 'ds'}",
                          f"tracking.uri=sqlite:///{tracking_db(tmp_path, 'ds.db')}")
    assert code == 0, log[-3000:]
    assert "student:teacher layers 1:2,2:4; hidden states through learned projections 128 -> 256" in ddp.stderr
    for out in ("ddp", "ds"):
        logged = {r["key"] for r in read_journal(tmp_path / out / "journal.jsonl") if r["type"] == "metric"}
        assert {names.train_loss_term(t) for t in ("task", "kd", "hidden", "attention")} <= logged, out
        saved = load_file(tmp_path / out / "best" / "model.safetensors")
        assert not any(k.startswith("kd_projections") for k in saved) and "classifier.weight" in saved, out


@pytest.mark.slow  # its teacher_dir trains a teacher
def test_a_quarter_width_student_by_weight_selection_distils_and_states_its_size(tmp_path, teacher_dir):
    """bangla-small (width 256, 4 heads of 64, feed-forward 1024) -> 2 layers of width 128: heads
    keep their size (2), the feed-forward its ratio (512); a quarter of the teacher's non-embedding
    parameters at most, sliced from it, every term on."""
    out = tmp_path / "out"
    figures = run(load_config(None, [*FAST, "model=from_teacher:2", "model_config.hidden_size=128",
                                     f"kd.teacher={teacher_dir}",
                                     "kd.hidden_weight=1.0", "kd.attention_weight=1.0", "train.max_steps=3",
                                     f"output_dir={out}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]),
                  kind="distill")
    assert np.isfinite(figures[names.TRAIN_LOSS])
    from pipeline.tracking.journal import read_journal

    records = read_journal(out / "journal.jsonl")
    logged = {r["key"]: r["value"] for r in records if r["type"] == "metric"}
    tags = {k: v for r in records if r["type"] == "tags" for k, v in r["tags"].items()}
    assert tags[names.TAG_STUDENT_INIT] == "weight-selection"
    assert 0 < logged[names.KD_PARAM_RATIO_NON_EMBEDDING] <= 0.25
    assert logged[names.MODEL_PARAMS] > logged[names.MODEL_PARAMS_NON_EMBEDDING] > 0
    assert 0 < logged[names.KD_FLOPS_RATIO] < logged[names.KD_PARAM_RATIO] < 1
    saved = json.loads((out / "best" / "config.json").read_text())
    assert (saved["hidden_size"], saved["num_attention_heads"], saved["intermediate_size"]) == (128, 2, 512)
    from safetensors.torch import load_file

    weights = load_file(out / "best" / "model.safetensors")
    assert sum(t.numel() for t in weights.values()) == logged[names.MODEL_PARAMS]
    for split in predictions.SPLITS:  # a distill stage keeps its predictions as a train stage does
        assert predictions.read(out / "predictions" / f"{split}.jsonl").header["model"] == "from_teacher:2"
    card = (out / "best" / "README.md").read_text()
    assert ("narrowed to hidden size 128 (the teacher's 256), attention heads 2 (the teacher's 4), feed-forward 512 "
            "(the teacher's 1024)") in card and "init weight-selection" in card
    refused = tmp_path / "refused"
    with pytest.raises(UserError, match="num_attention_heads=3: must divide the hidden size 128"):
        run(load_config(None, [*FAST, "model=from_teacher:2", "model_config.hidden_size=128",
                               "model_config.num_attention_heads=3", f"kd.teacher={teacher_dir}",
                               f"output_dir={refused}", f"tracking.uri=sqlite:///{refused}.db"]), kind="distill")
    assert not refused.exists() and not (tmp_path / "refused.db").exists()


@pytest.mark.slow  # a student distilled to its first checkpoint, then Ctrl-C
def test_ctrl_c_of_a_distill_job_is_one_line_and_its_run_ends_killed(tmp_path, teacher_dir):
    import signal

    from helpers import wait_for
    from pipeline.job.parts import checkpoint
    from pipeline.layout import OutputDir

    out, db = tmp_path / "out", tracking_db(tmp_path)
    args = [*FAST, f"kd.teacher={teacher_dir / 'best'}", "train.epochs=3", "train.save_every=5", f"output_dir={out}",
            f"tracking.uri=sqlite:///{db}"]
    with (tmp_path / "log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "distill", *args], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: checkpoint.complete(OutputDir(out)) or proc.poll() is not None, what="a checkpoint")
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to the whole process group
    assert proc.wait(timeout=120) == 130, (tmp_path / "log").read_text()[-3000:]
    text = (tmp_path / "log").read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and last.endswith(f"to continue: python -m pipeline distill "
                                                              f"{' '.join(args)} resume=auto"), last
    assert "Traceback" not in text
    (mlrun,) = mlflow_runs(db, "pipeline")
    assert mlrun.info.status == "KILLED"
