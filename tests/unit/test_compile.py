"""train.compile and the few batch shapes it needs: compiled steps agree with eager ones,
checkpoints move between the two, batches meet a few shapes and filler rows carry no loss, no
prediction and no throughput; the device defaults and the recompile warning."""
import logging
import time

import numpy as np
import pytest
import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

from helpers import ddp_syncs_buffers_every_forward, free_port
from pipeline import names
from pipeline.config import load_config
from pipeline.data.loaders import IGNORED, collate_shaped, real_rows
from pipeline.errors import UserError
from pipeline.evaluation import evaluate
from pipeline.job.plan import device_defaults
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import compiler, precision
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime
from pipeline.tasks.qa import QaTask

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def tiny_classifier(seed=0, labels=3):
    """Without dropout: compiled dropout draws its masks from inductor's own random stream."""
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(**TINY, num_labels=labels, hidden_dropout_prob=0,
                                                    attention_probs_dropout_prob=0)).train()


def batches(n=4, rows=4, length=8):
    generator = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(5, 100, (rows, length), generator=generator),
             "attention_mask": torch.ones(rows, length, dtype=torch.long),
             "labels": torch.randint(0, 3, (rows,), generator=generator)} for _ in range(n)]


def backend_for(model, mode, rt=CPU):
    backend = TorchBackend(rt, precision.PrecisionPolicy("fp32", "cpu"), max_grad_norm=1.0,
                           compile=compiler.resolve(mode, "cpu", rt.backend))
    backend.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    return backend


def losses(backend, data):
    out = []
    for batch in data:
        loss = backend.model(**batch).loss
        backend.backward(loss)
        backend.step()
        out.append(loss.item())
    return out


@pytest.fixture
def gloo_group():
    """A one-process gloo group: DDP's wrapper and hooks around a compiled module, in this process."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                         world_size=1)
    yield Runtime("torchrun", "ddp", 0, 0, 1, 1, torch.device("cpu"))
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------- few shapes


def collate_rows(lengths, labels_per_token=False):
    """A stand-in task collate: rows of the given lengths padded to the longest (pad id 0)."""
    def collate(features):
        longest = max(len(f["input_ids"]) for f in features)
        out = {"input_ids": torch.zeros(len(features), longest, dtype=torch.long),
               "attention_mask": torch.zeros(len(features), longest, dtype=torch.long),
               "idx": torch.tensor([f["idx"] for f in features])}
        for i, f in enumerate(features):
            out["input_ids"][i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            out["attention_mask"][i, :len(f["input_ids"])] = 1
        if labels_per_token:
            out["labels"] = torch.full((len(features), longest), IGNORED)
            for i, f in enumerate(features):
                out["labels"][i, :len(f["input_ids"])] = torch.tensor(f["tags"])
        else:
            out["labels"] = torch.tensor([f["label"] for f in features])
        return out
    generator = torch.Generator().manual_seed(2)
    features = [{"input_ids": torch.randint(5, 100, (n,), generator=generator).tolist(), "idx": i,
                 "label": i % 3, "tags": [(i + j) % 3 for j in range(n)]} for i, n in enumerate(lengths)]
    return collate, features


@pytest.mark.parametrize("lengths, multiple, max_length, expected", [
    ([3, 5], 8, 32, 8), ([9, 2], 8, 32, 16), ([30, 2], 8, 30, 30),  # the longest rows' bucket is max_length
    ([7], 1, 32, 7)])
def test_lengths_are_padded_to_a_few_buckets(lengths, multiple, max_length, expected):
    collate, features = collate_rows(lengths, labels_per_token=True)
    batch = collate_shaped(features, collate, multiple, max_length, pad_id=0)
    assert {k: v.shape[1] for k, v in batch.items() if v.dim() == 2} == dict.fromkeys(
        ("input_ids", "attention_mask", "labels"), expected)
    plain = collate(features)
    width = plain["input_ids"].shape[1]
    assert torch.equal(batch["input_ids"][:, :width], plain["input_ids"]) and not batch["input_ids"][:, width:].any()
    assert (batch["labels"][:, width:] == IGNORED).all() and not batch["attention_mask"][:, width:].any()


@pytest.mark.parametrize("per_token", [False, True])
def test_filler_rows_carry_no_loss_no_gradient_and_are_not_counted(per_token):
    """A short batch filled to full rows gives the short batch's loss and gradients (the heads'
    cross-entropy averages over targets that are not IGNORED); its filler rows are marked idx -1."""
    collate, features = collate_rows([4, 6, 3], labels_per_token=per_token)
    short = collate_shaped(features, collate, 8, 16, pad_id=0)
    filled = collate_shaped(features, collate, 8, 16, pad_id=0, rows=8)
    assert filled["input_ids"].shape == (8, 8) and filled["idx"].tolist() == [0, 1, 2] + [-1] * 5
    assert real_rows(filled["idx"]) == 3 and real_rows(short["idx"]) == 3
    assert (filled["labels"][3:] == IGNORED).all()

    head = BertForTokenClassification if per_token else BertForSequenceClassification
    torch.manual_seed(0)
    model = head(BertConfig(**TINY, num_labels=3, hidden_dropout_prob=0, attention_probs_dropout_prob=0))
    grads = []
    for batch in (short, filled):
        model.zero_grad()
        loss = model(**{k: v for k, v in batch.items() if k != "idx"}).loss
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert grads[1][0] == pytest.approx(grads[0][0], rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))


def test_qa_filler_rows_are_ignored_by_the_span_loss():
    task = QaTask()
    generator = torch.Generator().manual_seed(3)
    logits = {name: torch.randn(4, 8, generator=generator) for name in ("start_logits", "end_logits")}
    outputs = transformers.modeling_outputs.QuestionAnsweringModelOutput(**logits)
    batch = {"attention_mask": torch.ones(4, 8, dtype=torch.long), "start_positions": torch.tensor([1, 2, IGNORED,
             IGNORED]), "end_positions": torch.tensor([3, 4, IGNORED, IGNORED])}
    short = {k: v[:2] for k, v in batch.items()}
    short_outputs = transformers.modeling_outputs.QuestionAnsweringModelOutput(
        **{k: v[:2] for k, v in logits.items()})
    assert task.loss(outputs, batch).item() == pytest.approx(task.loss(short_outputs, short).item())


class _Sentiment:
    """The parts of a Task that evaluate() uses, for a 3-class classifier."""
    main_metric = "accuracy"

    def predictions(self, outputs, batch):
        return {"label": outputs.logits.argmax(-1).numpy()}

    def metrics(self, predictions, examples, features):
        return {"accuracy": float(np.mean(predictions["label"] == np.array([f["label"] for f in features])))}

    def stall(self, predictions, examples, features):
        return None


def test_evaluation_leaves_filler_rows_out_of_scores_and_loss():
    collate, features = collate_rows([4, 6, 3, 5, 7])
    model = tiny_classifier().eval()
    policy = precision.PrecisionPolicy("fp32", "cpu")
    scores = [evaluate(model, torch.utils.data.DataLoader(features, batch_size=4, collate_fn=shaped), _Sentiment(),
                       policy, CPU, None, features, keep=True)
              for shaped in (collate, lambda batch: collate_shaped(batch, collate, 8, 16, pad_id=0, rows=4))]
    assert scores[1].scores["accuracy"] == scores[0].scores["accuracy"]
    assert scores[1].scores["loss"] == pytest.approx(scores[0].scores["loss"], rel=1e-5)
    assert len(scores[1].predictions["label"]) == len(features)


# ---------------------------------------------------------------------- settings and figures


def test_device_defaults_follow_the_measurements():
    train = load_config(None, []).train
    graphs, eager = compiler.CompilePolicy("reduce-overhead", "test"), compiler.OFF
    gpu, cpu = device_defaults(train, True, graphs), device_defaults(train, False, eager)
    assert gpu == {"compile": "reduce-overhead", "pad_to_multiple_of": 16, "num_workers": 2}
    assert cpu == {"compile": "off", "pad_to_multiple_of": 1, "num_workers": 0}
    eager_gpu = device_defaults(load_config(None, ["train.compile=off"]).train, True, eager)
    assert eager_gpu["pad_to_multiple_of"] == 1
    mine = device_defaults(load_config(None, ["train.pad_to_multiple_of=32", "train.num_workers=0"]).train, True,
                           graphs)
    assert (mine["pad_to_multiple_of"], mine["num_workers"]) == (32, 0)


@pytest.mark.parametrize("requested, device, backend, stage, mode", [
    ("auto", "cuda", "single", 0, "reduce-overhead"), ("auto", "cuda", "ddp", 0, "off"),
    ("auto", "cpu", "single", 0, "off"), ("auto", "cuda", "deepspeed", 2, "off"),
    ("auto", "cuda", "deepspeed", 3, "off"), ("default", "cuda", "deepspeed", 3, "default"),
    ("reduce-overhead", "cpu", "single", 0, "reduce-overhead")])
def test_auto_compile_resolves_per_device_and_backend_and_says_why(requested, device, backend, stage, mode):
    chosen = compiler.resolve(requested, device, backend, f"zero{stage}")
    assert chosen.mode == mode and chosen.describe() == {"compile": mode, "compile_reason": chosen.reason}
    assert ("(set)" in chosen.reason) == (requested != "auto")
    if backend == "deepspeed" and requested == "auto":
        assert f"ZeRO-{stage}" in chosen.reason
    if (backend, device, requested) == ("ddp", "cuda", "auto"):  # eager until the GPU check's ddp check passes
        assert "gpu_check" in chosen.reason


def test_the_compile_policy_answers_what_the_stage_asks():
    graphs, inductor, eager = (compiler.CompilePolicy(m, "test") for m in ("reduce-overhead", "default", "off"))
    assert (graphs.cuda_graphs, inductor.cuda_graphs, eager.cuda_graphs) == (True, False, False)
    assert graphs.fill_short_batches(distilling=False) and not graphs.fill_short_batches(distilling=True)
    assert not eager.fill_short_batches(distilling=False) and not eager.compiled
    assert inductor.compiled and compiler.CompilePolicy("max-autotune", "test").cuda_graphs


def test_the_settled_plan_holds_one_policy_and_the_backend_logs_it(tmp_path):
    """settle() resolves train.compile once, for the device and the backend; the backend holds that
    policy and the run's resolved.* params say what was chosen and why."""
    from pipeline.job.plan import settle
    from pipeline.runtime.factory import make_backend

    cfg = load_config(None, [f"output_dir={tmp_path}"])
    plan = settle(cfg, "train", CPU)
    assert plan.compile.mode == plan.cfg.train.compile == "off" and "CPU" in plan.compile.reason
    backend = make_backend(plan.rt, plan.policy, plan.compile, plan.cfg.train, None)
    assert backend.compile is plan.compile and backend.describe()["compile_reason"] == plan.compile.reason


@pytest.mark.parametrize("override, message", [
    ("train.compile=fast", "train.compile=fast: must be one of auto | off | default | reduce-overhead | max-autotune"),
    ("train.pad_to_multiple_of=0", "train.pad_to_multiple_of=0: must be >= 1")])
def test_bad_compile_settings_are_one_line_errors(override, message):
    with pytest.raises(UserError, match=message.replace("|", r"\|")):
        load_config(None, [override]).validate()


def test_many_compilations_warn_once(caplog, monkeypatch):
    meters = StageMeters(torch.device("cpu"), "fp32", 1, compiled=True)
    counts = iter([3, compiler.WARN_COMPILES + 1, compiler.WARN_COMPILES + 5])
    monkeypatch.setattr(compiler, "compiles", lambda: next(counts))
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        for _ in range(3):
            meters.check_compiles()
    warnings = [r for r in caplog.records if "graphs in this process" in r.getMessage()]
    assert len(warnings) == 1 and "train.pad_to_multiple_of" in warnings[0].getMessage()


def test_compile_time_is_left_out_of_the_training_clock(monkeypatch):
    """Compilation inside a training segment (Dynamo's own clock) is not training time."""
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(compiler, "compile_seconds", lambda: next(clock))
    meters = StageMeters(torch.device("cpu"), "fp32", 1, compiled=True)
    start = time.perf_counter()
    meters.start_epoch()
    time.sleep(0.6)
    meters.throughput.add(8, 64, 64)

    figures = meters.end_epoch()
    wall = time.perf_counter() - start
    assert figures[names.COMPILE_TIME] == pytest.approx(0.5) and meters.totals.compile_seconds == pytest.approx(0.5)
    assert 0.6 - 0.5 - 0.01 <= figures[names.EPOCH_TIME] <= wall - 0.5


def test_a_mask_without_padding_changes_no_logit_and_one_with_padding_does():
    """What dropping an unpadded batch's mask rests on (CompilePolicy.drop_mask): SDPA without a mask
    gives the logits it gives with an all-ones one; a padded batch's mask is needed."""
    model = tiny_classifier().eval()
    (batch,) = batches(n=1)
    with torch.no_grad():
        masked = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        bare = model(input_ids=batch["input_ids"]).logits
        padded = batch["attention_mask"].clone()
        padded[0, -3:] = 0
        with_padding = model(input_ids=batch["input_ids"], attention_mask=padded).logits
    assert compiler.CompilePolicy.drop_mask(batch["attention_mask"]) and not compiler.CompilePolicy.drop_mask(padded)
    torch.testing.assert_close(bare, masked)
    assert not torch.allclose(with_padding[0], bare[0])


def test_ddp_broadcasts_no_buffers_as_the_models_buffers_are_constants(gloo_group):
    """DDP without a buffer sync before every forward (compat.ddp_without_forward_buffer_sync): what makes that
    safe is that training never changes a buffer (position and token-type ids), so every rank's stay equal."""
    backend = backend_for(tiny_classifier(), "off", gloo_group)
    assert not ddp_syncs_buffers_every_forward(backend.model)
    before = {k: v.clone() for k, v in backend.module.named_buffers()}
    losses(backend, batches(n=2))
    assert before and all(torch.equal(v, before[k]) for k, v in backend.module.named_buffers())


def test_a_padded_batch_mask_handed_in_4d_skips_transformers_all_ones_check(monkeypatch):
    """Eager, a padded batch's mask goes to the model in SDPA's 4D form (Stage.model_inputs): the
    logits are the 2D mask's, and transformers never asks whether the mask is all ones (on a GPU
    that `.all()` is a host sync per step). Counted here by wrapping Tensor.all."""
    from pipeline import models

    model = tiny_classifier().eval()
    (batch,) = batches(n=1)
    mask = batch["attention_mask"].clone()
    mask[0, -3:] = 0
    assert models.takes_prepared_mask(model) and not compiler.OFF.compiled
    assert compiler.CompilePolicy("default", "test").compiled
    checks = []
    real_all = torch.Tensor.all
    monkeypatch.setattr(torch.Tensor, "all", lambda self, *a, **k: (checks.append(1), real_all(self, *a, **k))[1])
    with torch.no_grad():
        flat = model(input_ids=batch["input_ids"], attention_mask=mask).logits
        flat_checks = len(checks)
        prepared = model(input_ids=batch["input_ids"], attention_mask=mask[:, None, None, :].bool()).logits
    assert flat_checks >= 1 and len(checks) == flat_checks
    torch.testing.assert_close(prepared, flat)
