"""What only a GPU can check: NCCL gives what one process gives, fp16 with its loss scaler runs
end to end (GradScaler under torchrun, DeepSpeed's scaler under ZeRO), ZeRO-2/3 hold less memory
than DDP, bf16 under DeepSpeed is autocast on fp32 weights on CUDA too, NVML energy is
measured, a capped card finds a smaller batch (and checkpointing a larger one) for the same global
batch, and checkpointing lowers the peak without changing the losses. Marked `gpu`: skipped
without CUDA (the reason is printed by -ra), run on a GPU machine with `pytest -m gpu`.
"""
import json
import os

import pytest
import torch

from helpers import FAST, deepspeed, mlflow_runs, run_cli, settled_train, torchrun, tracking_db
from pipeline import names

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
WHY_NONE = ("needs a CUDA GPU; the CPU suite hides them: run `pytest -m gpu`"
            if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else "needs a CUDA GPU, none is visible")
pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(GPUS == 0, reason=WHY_NONE)]
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, {GPUS} visible")
# a model big enough that memory and energy are not noise: bangla-base widened to BERT-base's layer
WIDE = ["model=preset:bangla-base", "model_config.hidden_size=768", "model_config.intermediate_size=3072",
        "model_config.num_attention_heads=12"]
JOB = [*FAST, "train.batch_size=16", "train.max_steps=40"]


def finished(tmp_path, *args, launcher="cli", nproc=2):
    """Run one stage; its metrics.json and MLflow run."""
    out, db = tmp_path / "out", tracking_db(tmp_path)
    common = [*args, f"output_dir={out}", f"tracking.uri=sqlite:///{db}", "tracking.experiment=gpu"]
    if launcher == "deepspeed":
        code, log = deepspeed("train", *common)
        assert code == 0, log[-3000:]
    else:
        result = torchrun(nproc, "train", *common) if launcher == "torchrun" else run_cli("train", *common)
        assert result.returncode == 0, result.stderr[-3000:]
    (run,) = mlflow_runs(db, "gpu")
    return json.loads((out / "metrics.json").read_text()), run, out


@two_gpus
def test_nccl_two_ranks_match_one_process_on_the_same_global_batch(tmp_path):
    one, _, _ = finished(tmp_path / "one", *JOB, "precision=fp32", "train.batch_size=32")
    two, run, _ = finished(tmp_path / "two", *JOB, "precision=fp32", launcher="torchrun")
    assert run.data.tags["backend"] == "ddp" and run.data.tags["world_size"] == "2"
    assert two[names.TRAIN_LOSS] == pytest.approx(one[names.TRAIN_LOSS], rel=0.05)
    assert abs(two[names.EVAL_MAIN] - one[names.EVAL_MAIN]) < 0.05


NO_DROPOUT = ["model_config.hidden_dropout_prob=0", "model_config.attention_probs_dropout_prob=0"]
GRAPHS_JOB = [*JOB, *NO_DROPOUT, "train.batch_size=8", "train.grad_accum=2"]
"""The jobs the CUDA-graph, fp16 and energy tests share (one eager and one compiled job per precision):
grad_accum=2, so the first micro-batch's .grad is a captured backward's output the second adds to."""


@pytest.fixture(scope="module")
def graphs_and_eager(tmp_path_factory):
    """(final metrics, MLflow run, output_dir) of GRAPHS_JOB per (precision, compile), each run once per
    worker (`pytest -m gpu -n 3 --dist loadgroup` keeps the tests that share them on one worker)."""
    done = {}

    def job(precision: str, mode: str):
        if (precision, mode) not in done:
            where = tmp_path_factory.mktemp(f"{precision}-{mode}")
            done[precision, mode] = finished(where, *GRAPHS_JOB, f"precision={precision}", f"train.compile={mode}")
        return done[precision, mode]
    return job


@pytest.mark.xdist_group("graphs")
def test_fp16_with_grad_scaler_end_to_end(graphs_and_eager):
    final, run, out = graphs_and_eager("fp16", "off")
    assert run.data.metrics[names.LOSS_SCALE] >= 1.0 and final[names.NONFINITE_LOSSES] == 0
    assert final[names.SKIPPED_STEPS] < 10  # a few overflow skips while the scale settles, not a stuck scaler
    assert json.loads((out / "best" / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.xdist_group("graphs")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_grad_accumulation_under_cuda_graphs_trains_like_eager(graphs_and_eager, precision):
    """train.compile=reduce-overhead (the GPU default) with grad_accum=2 against eager on the same job,
    without dropout (compiled dropout draws inductor's random numbers). The step is marked once per
    optimizer step, so the first micro-batch's .grad (a captured backward's output) is never freed
    before the second adds to it (CompilePolicy.begin_step): the final loss within 5% and the
    dev score within 0.05 (inductor's fused 16-bit kernels round differently from eager's per-op ones
    over 40 steps; a freed .grad gives garbage or torch's "overwritten" error); a handful of graphs
    (length buckets and the filled last batch), compile time logged apart."""
    eager, _, _ = graphs_and_eager(precision, "off")
    graphs, run, _ = graphs_and_eager(precision, "reduce-overhead")
    assert run.data.params["resolved.grad_accum"] == "2" and run.data.params["resolved.compile"] == "reduce-overhead"
    assert graphs[names.TRAIN_LOSS] == pytest.approx(eager[names.TRAIN_LOSS], rel=0.05)
    assert abs(graphs[names.EVAL_MAIN] - eager[names.EVAL_MAIN]) < 0.05
    assert graphs[names.COMPILE_TIME] > 0 and 1 <= graphs[names.COMPILES] <= 16
    assert names.COMPILE_TIME not in eager and run.data.params["train.compile"] == "reduce-overhead"


@two_gpus
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_fp16_logs_its_loss_scale_under_every_zero_stage(tmp_path, stage):
    final, run, _ = finished(tmp_path, *JOB, "precision=fp16", f"deepspeed=ds_configs/zero{stage}.json",
                             launcher="deepspeed")
    assert run.data.metrics[names.LOSS_SCALE] >= 1.0 and names.SKIPPED_STEPS in run.data.metrics
    assert final[names.TRAIN_STEPS] == 40


@two_gpus
def test_zero2_and_zero3_hold_less_memory_than_ddp(tmp_path):
    peak = {}
    _, run, _ = finished(tmp_path / "ddp", *JOB, *WIDE, "precision=bf16", launcher="torchrun")
    peak["ddp"] = run.data.metrics[names.PEAK_MEM_ALLOCATED]
    for stage in (2, 3):
        _, run, out = finished(tmp_path / f"zero{stage}", *JOB, *WIDE, "precision=bf16",
                               f"deepspeed=ds_configs/zero{stage}.json", launcher="deepspeed")
        peak[stage] = run.data.metrics[names.PEAK_MEM_ALLOCATED]
        resolved = json.loads((out / "deepspeed_config.json").read_text())
        assert resolved["zero_optimization"]["reduce_bucket_size"] == 768 * 768
    assert peak[2] < peak["ddp"] and peak[3] < peak["ddp"], peak


def test_bf16_under_deepspeed_is_autocast_on_fp32_weights_on_cuda(monkeypatch):
    """The CPU test of every ZeRO stage (test_deepspeed.py), on the CUDA accelerator."""
    from helpers import free_port
    from pipeline.runtime import precision, world
    from pipeline.runtime.deepspeed_backend import DeepSpeedBackend

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)  # one process, restored afterwards
    rt = world.init("deepspeed")
    try:
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=128, num_labels=3))
        backend = DeepSpeedBackend(rt, precision.resolve("bf16", rt.device),
                                   settled_train("train.batch_size=4", device="cuda"), "ds_configs/zero3.json")
        engine = backend.prepare(model.to(rt.device), torch.optim.AdamW(model.parameters()))
        seen = {}
        backend.module.bert.encoder.layer[0].output.LayerNorm.register_forward_hook(
            lambda m, a, out: seen.update(layernorm=out.dtype, autocast=torch.is_autocast_enabled("cuda")))
        batch = {"input_ids": torch.randint(5, 100, (4, 8), device=rt.device),
                 "labels": torch.tensor([0, 1, 2, 0], device=rt.device)}
        loss = engine(**batch).loss
        backend.backward(loss)
        assert backend.step().stepped and loss.dtype == torch.float32
        assert seen == {"layernorm": torch.float32, "autocast": True}
        assert {p.dtype for p in backend.module.parameters()} == {torch.float32}
    finally:
        world.shutdown()


@pytest.mark.xdist_group("graphs")
def test_energy_is_measured_on_a_gpu(graphs_and_eager):
    """NVML's counter read over the training segments (its figures against compile: the GPU check's mfu
    check, alone on the GPU); fp16's eager job, which the GPU check keeps (bf16's runs in its fallback
    check instead)."""
    final, run, _ = graphs_and_eager("fp16", "off")
    if run.data.tags["energy_available"] != "true":
        pytest.skip("NVML's total-energy counter cannot be read on this GPU (pre-Volta, or no permission)")
    assert final[names.ENERGY_JOULES] > 0 and final[names.AVG_POWER] > 10  # an idle H100 draws ~70 W
    assert 0 < final[names.JOULES_PER_SAMPLE] < final[names.ENERGY_JOULES]


def test_torchrun_beyond_the_visible_gpus_falls_back_on_nccl(tmp_path):
    """Twice as many processes as GPUs: the surplus ranks exit 0, the others form an NCCL group
    (or run alone) on their own GPUs, with grad_accum 2 keeping the global batch (eager: the launch is
    under test; the GPU check's fallback check runs the compiled step)."""
    _, run, _ = finished(tmp_path, *JOB, "train.batch_size=4", "train.compile=off", launcher="torchrun",
                         nproc=2 * GPUS)
    tags = run.data.tags
    assert (tags[names.TAG_FALLBACK], tags["world_size"], tags[names.TAG_REQUESTED_WORLD_SIZE]) == \
        ("true", str(GPUS), str(2 * GPUS))
    assert run.data.params["resolved.grad_accum"] == "2"
    assert run.data.params["resolved.global_batch"] == str(4 * 2 * GPUS)


def test_cached_teacher_rows_reach_the_gpu_from_pinned_memory():
    """The cached teacher rows of each micro-batch go host -> GPU from pinned memory without the
    host waiting; 200 copies in flight, none of their pinned blocks reused before its copy ran."""
    from types import SimpleNamespace

    from torch.profiler import ProfilerActivity, profile

    from pipeline.kd.distill import Distiller

    distiller = Distiller.__new__(Distiller)  # only the cache lookup is under test
    distiller.cached = {"logits": torch.randn(4096, 48, 9).half()}
    distiller.task = SimpleNamespace(kd_outputs={"logits": True})  # per-token outputs, as NER
    distiller.rt = SimpleNamespace(device=torch.device("cuda", 0))
    picks = [torch.randint(0, 4096, (32,)) for _ in range(200)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rows = [distiller._cached_rows("logits", idx, 40) for idx in picks]
        torch.cuda.synchronize()
    for idx, got in zip(picks, rows):
        assert torch.equal(got.cpu(), distiller.cached["logits"][idx][:, :40])
    copies = [e.name for e in prof.events() if "Memcpy HtoD" in e.name]
    assert copies and all("Pinned" in name for name in copies), set(copies)


# ---------------------------------------------------------------- small GPUs (docs/small-gpus.md)
LONG = [*WIDE, *NO_DROPOUT, "train.max_length=256", "train.pad_to_multiple_of=256", "train.max_steps=4",
        "precision=bf16", "train.compile=off"]
"""Eager, without dropout: memory and the recompute are under test, not inductor (whose compiled dropout
draws its own random numbers, and whose compilation would take most of these jobs' time)."""


def test_a_capped_gpu_finds_a_smaller_batch_and_checkpointing_a_larger_one_for_the_same_global_batch(tmp_path):
    """train.memory_limit_mb through the allocator's fraction: the capped card's found micro-batch is
    smaller than the whole card's, its peak allocated stays under the cap, the global batch (16 x 8
    rows) is the one asked for, and checkpointing raises the ceiling under the same cap."""
    import yaml

    auto = [*LONG, "train.batch_size=auto", "train.grad_accum=8"]
    split = {}
    for name, extra in (("whole", []), ("capped", ["train.memory_limit_mb=3072"]),
                        ("checkpointed", ["train.memory_limit_mb=3072", "train.gradient_checkpointing=true"])):
        final, run, out = finished(tmp_path / name, *auto, *extra)
        written = yaml.safe_load((out / "config.yaml").read_text())["train"]
        assert written["batch_size"] * written["grad_accum"] == 128
        assert names.TAG_BATCH_FIT in run.data.tags
        split[name] = written["batch_size"]
        if extra:
            assert final[names.PEAK_MEM_RESERVED] <= 3072
    assert split["capped"] < split["whole"] and split["checkpointed"] > split["capped"]


def test_checkpointing_lowers_the_peak_and_keeps_the_losses_on_a_gpu(tmp_path):
    fixed = [*LONG, "train.batch_size=16", "precision=fp32"]
    plain, _, _ = finished(tmp_path / "plain", *fixed)
    checkpointed, _, _ = finished(tmp_path / "ckpt", *fixed, "train.gradient_checkpointing=true")
    assert checkpointed[names.PEAK_MEM_ALLOCATED] < 0.7 * plain[names.PEAK_MEM_ALLOCATED]
    # no dropout, eager: the recompute gives the same activations; CUDA's atomics leave a last-bit difference
    assert checkpointed[names.TRAIN_LOSS] == pytest.approx(plain[names.TRAIN_LOSS], rel=1e-4)
