"""DeepSpeed on CPU (its CPU accelerator, gloo): the tests that train a model or start a process (the
others are in tests/unit/test_deepspeed.py)."""
import json
import os
import signal

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from helpers import (
    FAST,
    ROOT,
    assert_same_result,
    deepspeed,
    error_lines,
    free_port,
    mlflow_runs,
    run_cli,
    settled_train,
    torchrun,
    tracking_db,
    wait_for,
)
from pipeline import names
from pipeline.job.parts import checkpoint
from pipeline.job.parts.optim import build_optimizer, lr_schedule
from pipeline.layout import OutputDir
from pipeline.runtime import compiler, precision, world
from pipeline.runtime.deepspeed_backend import (
    DeepSpeedBackend,
)

JOB = [*FAST, "train.batch_size=16", "train.epochs=1"]
"""One epoch of 75 steps of 2 x 16: dev macro-F1 0.72 under both DDP and ZeRO-3 in bf16 (chance ~0.33)."""


@pytest.fixture(scope="module")
def ddp_bf16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    result = torchrun(2, "train", *JOB, "precision=bf16", f"output_dir={tmp}", f"tracking.uri=sqlite:///{tracking_db(tmp)}")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp / "metrics.json").read_text())


@pytest.mark.slow
def test_zero3_in_bf16_lands_close_to_ddp(tmp_path, ddp_bf16):
    # ZeRO-3, the stage that shards the parameters too; ZeRO-2 runs in the resume and KD tests
    stage = 3
    db = tracking_db(tmp_path)
    code, out = deepspeed("train", *JOB, "precision=bf16", f"deepspeed=ds_configs/zero{stage}.json",
                          f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}", "tracking.experiment=ds")
    assert code == 0, out[-3000:]
    final = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert final[names.EVAL_MAIN] > 0.6  # it learned (chance is ~0.33)
    assert abs(final[names.EVAL_MAIN] - ddp_bf16[names.EVAL_MAIN]) < 0.1  # close to DDP, not equal
    resolved = json.loads((tmp_path / "out" / "deepspeed_config.json").read_text())
    assert resolved["zero_optimization"]["stage"] == stage and resolved["bf16"]["enabled"] is False
    assert resolved["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}  # fp32 weights, autocast
    assert resolved["train_micro_batch_size_per_gpu"] == 16 and resolved["train_batch_size"] == 32
    (mlrun,) = mlflow_runs(db, "ds")
    assert mlrun.data.tags["backend"] == "deepspeed" and mlrun.data.tags["world_size"] == "2"
    assert mlrun.data.tags["launcher"] == "deepspeed"
    assert {names.SKIPPED_STEPS, names.TRAIN_GRAD_NORM, names.EVAL_MAIN} <= set(mlrun.data.metrics)
    assert (tmp_path / "out" / "best" / "model.safetensors").is_file()  # consolidated from the shards


@pytest.mark.slow
def test_deepspeed_kill_and_resume_through_engine_checkpoints(tmp_path):
    """Killed and resumed under the deepspeed launcher; the uninterrupted reference runs the same
    engine under torchrun (backend=deepspeed: the same two ranks, one launcher process instead of
    the deepspeed launcher's two), so the figures must not depend on the launcher either."""
    job = [*FAST, "train.batch_size=16", "train.max_steps=20", "train.save_every=5", "deepspeed=ds_configs/zero2.json"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    result = torchrun(2, "train", *job, "backend=deepspeed", f"output_dir={ref}",
                      f"tracking.uri=sqlite:///{tracking_db(tmp_path, 'r.db')}")
    assert result.returncode == 0, result.stderr[-3000:]
    proc = deepspeed("train", *job, f"output_dir={out}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}",
                     log=tmp_path / "log", wait=False)
    wait_for(lambda: (checkpoint.latest(OutputDir(out)) or checkpoint.Checkpoint(None, 0)).step >= 10
             or proc.poll() is not None,
             what="a checkpoint at step 10")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (checkpoint.latest(OutputDir(out)).path / "engine").is_dir()  # DeepSpeed's own checkpoint inside ours
    code, log = deepspeed("train", *job, f"output_dir={out}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}",
                          "resume=auto")
    assert code == 0, log[-3000:]
    assert "resumed from" in log
    assert_same_result(ref, out)


@pytest.fixture(scope="module")
def deepspeed_process_group():
    """One gloo process group for the in-process engines (DeepSpeed needs one even alone)."""
    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    os.environ["MASTER_PORT"] = str(free_port())
    rt = world.init("deepspeed", want_cuda=False)
    yield rt
    world.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.slow
def test_a_cpu_engine_starts_without_compiling_the_shm_all_reduce(deepspeed_process_group):
    """DeepSpeed's CPU accelerator would JIT-compile its shared-memory all-reduce (minutes of C++ on
    a first run) for inference only; the pipeline's engine trains without it, through gloo. The
    engine runs the batch split handed to prepare (batch_size=auto finds it after the config was
    read and checked), not the one the backend was built with."""
    from deepspeed.comm import comm as ds_comm

    train = settled_train("train.batch_size=4")
    backend = DeepSpeedBackend(deepspeed_process_group, precision.PrecisionPolicy("fp32", "cpu"), train,
                               "ds_configs/zero2.json")
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=2))
    found = settled_train("train.batch_size=2", "train.grad_accum=2")
    engine = backend.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), found)
    assert ds_comm.cdb.shm_comm_op is None
    assert (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()) == (2, 2)
    backend.backward(engine(input_ids=torch.randint(5, 100, (4, 8)), labels=torch.tensor([0, 1, 0, 1])).loss)
    assert backend.step().stepped


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_under_every_zero_stage_is_autocast_on_fp32_weights(deepspeed_process_group, stage):
    """The engine on DeepSpeed's CPU accelerator, through the pipeline's backend and its ds_configs:
    fp32 parameters, autocast on inside the engine's forward, LayerNorm and loss in fp32, a real
    step with its gradient norm, a non-finite step skipped, buckets sized from the model; and the
    fp16 loss scale readable from every ZeRO optimizer (the CPU accelerator trains no fp16: the
    engine is told it is in fp16 mode, a stand-in)."""
    train = settled_train("train.batch_size=4")
    backend = DeepSpeedBackend(deepspeed_process_group, precision.PrecisionPolicy("bf16", "cpu"), train,
                               f"ds_configs/zero{stage}.json")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=3))
    engine = backend.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    seen = {}
    layer = backend.module.bert.encoder.layer[0]
    layer.attention.self.query.register_forward_hook(
        lambda m, a, out: seen.update(autocast=torch.is_autocast_enabled("cpu"), matmul=out.dtype))
    layer.output.LayerNorm.register_forward_hook(lambda m, a, out: seen.update(layernorm=out.dtype))
    batch = {"input_ids": torch.randint(5, 100, (4, 8)), "attention_mask": torch.ones(4, 8, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 0])}
    with backend.policy.autocast():  # as the loop calls it
        loss = engine(**batch).loss
    backend.backward(loss)
    result = backend.step()
    assert {p.dtype for p in backend.module.parameters()} == {torch.float32}
    assert seen == {"autocast": True, "matmul": torch.bfloat16, "layernorm": torch.float32}
    assert loss.dtype == torch.float32 and result.stepped
    zero = backend.ds_config["zero_optimization"]
    assert '"auto"' not in json.dumps(backend.ds_config)
    if stage in (1, 2):
        assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 32 * 32
    if stage == 3:
        assert zero["stage3_param_persistence_threshold"] == 320
    assert torch.isfinite(result.grad_norm) and result.grad_norm > 0
    before = backend.full_state_dict()  # gathered: ZeRO-3 refreshes its whole parameters lazily
    with backend.policy.autocast():
        backend.backward(engine(**batch).loss * float("nan"))
    assert not backend.step().stepped  # a non-finite update is skipped, not applied
    after = backend.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    engine.fp16_enabled = lambda: True
    if stage == 0:  # a plain torch optimizer: ZeRO-0 fp16 is DeepSpeed's FP16_Optimizer, built only in fp16
        assert backend.loss_scale is None
    else:
        assert type(engine.optimizer).__name__ == ("DeepSpeedZeroOptimizer_Stage3" if stage == 3
                                                   else "DeepSpeedZeroOptimizer")
        assert backend.loss_scale == 1.0  # cur_scale: the ZeRO optimizers have no loss_scale_config


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
    (line,) = error_lines(result)
    assert message in line and not (tmp_path / "m.db").exists()


@pytest.mark.slow
def test_fp16_under_deepspeed_on_cpu_is_refused(tmp_path, monkeypatch):
    result = run_cli("train", *FAST, "backend=deepspeed", "precision=fp16", f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert "fp16" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_compiled_engine_steps_like_an_eager_one(deepspeed_process_group):
    """train.compile under DeepSpeed goes through the engine's own compile (in place): the same
    losses as the eager engine within 1e-4 over 3 ZeRO-2 steps (a tiny BERT without dropout, whose
    compiled masks would come from inductor's own random stream), and the module's keys unchanged."""
    torch._dynamo.reset()
    batches = [{"input_ids": torch.randint(5, 100, (4, 8), generator=torch.Generator().manual_seed(i)),
                "attention_mask": torch.ones(4, 8, dtype=torch.long), "labels": torch.tensor([0, 1, 2, 0])}
               for i in range(3)]
    losses, keys = {}, {}
    for mode in ("off", "default"):
        train = settled_train("train.batch_size=4", f"train.compile={mode}")
        backend = DeepSpeedBackend(deepspeed_process_group, precision.PrecisionPolicy("fp32", "cpu"), train,
                                   "ds_configs/zero2.json", compiler.resolve(mode, "cpu", "deepspeed", "zero2"))
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            num_labels=3, hidden_dropout_prob=0, attention_probs_dropout_prob=0))
        engine = backend.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        assert engine.is_compiled == (mode != "off")
        losses[mode] = []
        for batch in batches:
            loss = engine(**batch).loss
            backend.backward(loss)
            backend.step()
            losses[mode].append(loss.item())
        keys[mode] = set(backend.module.state_dict())
    assert losses["default"] == pytest.approx(losses["off"], rel=1e-4)
    assert keys["default"] == keys["off"] and not any("_orig_mod" in k for k in keys["default"])


@pytest.mark.slow
def test_an_optimizer_block_steps_at_the_pipelines_schedule_with_its_no_decay_groups(deepspeed_process_group,
                                                                                     tmp_path):
    """A DeepSpeed JSON with an optimizer block: the engine builds that optimizer over the pipeline's
    parameter groups (biases and LayerNorm without weight decay), and the schedule the loop builds
    over backend.optimizer is the lr applied: at warm-up's first step (lr 0) no weight moves, then
    they do. ZeRO-2 on DeepSpeed's CPU accelerator."""
    config = json.loads((ROOT / "ds_configs" / "zero2.json").read_text())
    # torch_adam: torch's AdamW, not DeepSpeed's FusedAdam (a C++ build of minutes on the CPU accelerator)
    config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    train = settled_train("train.batch_size=4", "train.lr=1e-2", "train.weight_decay=0.1", "train.warmup_ratio=0.5")
    backend = DeepSpeedBackend(deepspeed_process_group, precision.PrecisionPolicy("fp32", "cpu"), train,
                               str(tmp_path / "ds.json"))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=3))
    handed, _ = build_optimizer(model, train, total_steps=4, fused=False)
    engine = backend.prepare(model, handed)
    assert backend.optimizer is not handed  # the JSON's optimizer, built by the engine
    assert [g["weight_decay"] for g in backend.optimizer.param_groups] == [0.1, 0.0]
    schedule = lr_schedule(backend.optimizer, train, total_steps=4)  # as the loop builds it (train.setup_loop)
    batch = {"input_ids": torch.randint(5, 100, (4, 8)), "labels": torch.tensor([0, 1, 2, 0])}
    moved = []
    for _ in range(2):
        before = backend.full_state_dict()
        backend.backward(engine(**batch).loss)
        backend.step()
        after = backend.full_state_dict()
        moved.append(any(not torch.equal(before[k], after[k]) for k in before))
        schedule.step()
    assert moved == [False, True] and schedule.get_last_lr()[0] == pytest.approx(1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_activation_checkpointing_under_every_zero_stage_changes_no_loss(deepspeed_process_group, stage):
    """train.gradient_checkpointing inside the engine (ZeRO-3 gathers each layer's parameters again
    for the recompute, through the submodules' hooks): with dropout on, the same losses and weights
    over 3 steps as without it."""
    from pipeline import models

    batches = [{"input_ids": torch.randint(5, 100, (4, 8), generator=torch.Generator().manual_seed(i)),
                "attention_mask": torch.ones(4, 8, dtype=torch.long), "labels": torch.tensor([0, 1, 2, 0])}
               for i in range(3)]
    losses, weights = {}, {}
    for checkpointed in (False, True):
        backend = DeepSpeedBackend(deepspeed_process_group, precision.PrecisionPolicy("fp32", "cpu"),
                                   settled_train("train.batch_size=4"), f"ds_configs/zero{stage}.json")
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=2, intermediate_size=64, num_labels=3))
        if checkpointed:
            models.checkpoint_activations(model, "test")
        engine = backend.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        engine.train()
        torch.manual_seed(1)  # dropout's stream
        losses[checkpointed] = []
        for batch in batches:
            loss = engine(**batch).loss
            backend.backward(loss)
            assert backend.step().stepped
            losses[checkpointed].append(loss.item())
        weights[checkpointed] = backend.full_state_dict()
    assert losses[True] == losses[False]
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])
