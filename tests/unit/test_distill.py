"""Knowledge distillation: loss properties, the DistilBERT-style student, the teacher-logit
cache, and a distill stage on two torchrun nodes (ZeRO-2 distillation: test_model_families)."""

import math
import re

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from helpers import settled_train
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.kd import distill, teacher_cache, terms
from pipeline.runtime.compiler import OFF
from pipeline.runtime.factory import make_backend
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


def test_kd_loss_is_zero_for_identical_logits_and_scales_with_t_squared():
    torch.manual_seed(0)
    s, t = torch.randn(5, 4), torch.randn(5, 4)
    assert terms.kd_loss(t.clone(), t, 2.0).item() == pytest.approx(0.0, abs=1e-7)
    for temperature in (1.0, 2.0, 4.0):
        p = torch.softmax(t / temperature, -1).numpy()
        q = torch.softmax(s / temperature, -1).numpy()
        kl = float(np.mean(np.sum(p * (np.log(p) - np.log(q)), -1)))  # KL(teacher || student) per row
        assert terms.kd_loss(s, t, temperature).item() == pytest.approx(temperature**2 * kl, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kd_loss_gradients_stay_finite_with_extreme_16bit_logits(dtype):
    s = torch.tensor([[6e4, -6e4, 0.0], [-6e4, 6e4, 1.0]]).to(dtype).requires_grad_()
    t = torch.tensor([[-6e4, 6e4, 0.0], [6e4, -6e4, 1.0]]).to(dtype)
    loss = terms.kd_loss(s, t, 2.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s.grad).all()


def make_distiller(teacher, cfg_overrides=()):
    cfg = load_config(None, list(cfg_overrides))
    return distill.Distiller(cfg.kd, cfg.train.eval_batch_size, get_task("sentiment"), PrecisionPolicy("fp32", "cpu"),
                             CPU, teacher)


@pytest.fixture(scope="module")
def train():
    """The built-in sentiment sample set's training split, read once (normalizing it is most of its cost)."""
    return get_task("sentiment").load(None, "train")


def tiny_setup(train, rows=64):
    from pipeline import models

    task = get_task("sentiment")
    tokenizer, teacher = models.build("preset:bangla-tiny", task, task.texts(train), {}, 48)
    return task, train[:rows], tokenizer, teacher


def test_a_tokenizer_loaded_from_another_path_hits_the_cache(tmp_path, train):
    """The same vocabulary saved to two folders gives the same token ids, so the same teacher
    outputs: the second job hits. Features in another row order miss (row i must stay row i)."""
    from transformers import AutoTokenizer

    task, examples, tokenizer, teacher = tiny_setup(train)
    for folder in ("a", "b"):
        tokenizer.save_pretrained(tmp_path / folder)
    first, second = (AutoTokenizer.from_pretrained(tmp_path / folder) for folder in ("a", "b"))
    d = make_distiller(teacher)
    d.prepare(task.featurize(examples, first, 48, "train"), task.collator(first), 48, first)
    again = make_distiller(teacher)
    again.prepare(task.featurize(examples, second, 48, "train"), task.collator(second), 48, second)
    assert (d.cache_hit, again.cache_hit) == (False, True)
    assert torch.equal(again.cached["logits"], d.cached["logits"])
    shuffled = make_distiller(teacher)
    shuffled.prepare(task.featurize(examples[::-1], second, 48, "train"), task.collator(second), 48, second)
    assert shuffled.cache_hit is False
    assert torch.equal(shuffled.cached["logits"], d.cached["logits"].flip(0))


def test_a_teacher_with_the_same_weights_but_another_architecture_misses(train):
    """model_config overrides reach the teacher too: 4 attention heads instead of 2 over the same
    weights is another function, so its logits must not come from the 2-head teacher's cache."""
    task, examples, tokenizer, teacher = tiny_setup(train)
    features, collate = task.featurize(examples, tokenizer, 48, "train"), task.collator(tokenizer)
    config = teacher.config.__class__.from_dict({**teacher.config.to_dict(), "num_attention_heads": 4})
    four_heads = task.model_class.from_config(config)
    four_heads.load_state_dict(teacher.state_dict())
    two, four = make_distiller(teacher), make_distiller(four_heads)
    two.prepare(features, collate, 48, tokenizer)
    four.prepare(features, collate, 48, tokenizer)
    assert four.cache_hit is False
    assert not torch.allclose(two.cached["logits"], four.cached["logits"])


def test_the_teacher_pass_is_dealt_out_evenly_and_covers_every_row_once():
    lengths = np.random.default_rng(0).lognormal(3.5, 0.7, size=1001).clip(3, 256).astype(np.int64)  # long-tailed
    (single,) = teacher_cache.deal_batches(lengths, 16, 1)
    assert sorted(np.concatenate(single).tolist()) == list(range(1001))
    for world in (2, 3, 8):
        shares = teacher_cache.deal_batches(lengths, 16, world)
        # the batches one process forms (identical padding, identical results), each on one rank
        assert sorted(b.tolist() for share in shares for b in share) == sorted(b.tolist() for b in single)
        tokens = [sum(len(b) * int(lengths[b].max()) for b in share) for share in shares]  # padded cost
        assert max(tokens) - min(tokens) <= max(len(b) * int(lengths[b].max()) for b in single)  # < one batch


def test_hidden_mse_counts_real_tokens_only():
    student = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    teacher = torch.tensor([[[1.0, 0.0], [3.0, 1.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])  # the third position is padding
    # squared errors of the real tokens: (0 + 4) + (0 + 9) over 2 tokens x 2 dims
    assert terms.hidden_mse(student, teacher, mask).item() == pytest.approx(13 / 4)
    assert terms.hidden_mse(teacher, teacher, mask).item() == 0.0


def test_hidden_term_adds_to_the_loss_and_trains_a_projection_per_mapped_layer():
    """A 2-layer student of a 4-layer teacher, half its width: uniform map 1:2,2:4 plus the
    embeddings 0:0, each through its own projection, the term their mean."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=50, num_attention_heads=2, num_labels=3)
    teacher = BertForSequenceClassification(BertConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                                       **sizes))
    student = BertForSequenceClassification(BertConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                                       **sizes))
    student.eval()  # no dropout: both forward passes see the same student
    batch = {"input_ids": torch.randint(5, 50, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 0])}
    batch["attention_mask"][0, 5:] = 0
    plain = make_distiller(teacher, ["kd.cache=false"])
    plain.watch_student(student)
    base = plain.loss(student(**batch), batch, torch.arange(4), student).total
    d = make_distiller(teacher, ["kd.cache=false", "kd.hidden_weight=1.5"])
    d.watch_student(student)
    assert d.layer_pairs == [(1, 2), (2, 4)] and len(student.kd_projections) == 3
    assert {p.shape for p in student.kd_projections.parameters()} == {(16, 8), (16,)}
    assert {f"kd_projections.{k}.weight" for k in range(3)} <= student._keys_to_ignore_on_save
    outputs = student(**batch, **d.forward_kwargs)
    loss = d.loss(outputs, batch, torch.arange(4), student)
    with torch.no_grad():
        hidden_t = teacher(**batch, output_hidden_states=True).hidden_states
        expected = sum(terms.hidden_mse(student.kd_projections[k](outputs.hidden_states[s]), hidden_t[t],
                                        batch["attention_mask"]) for k, (s, t) in enumerate([(0, 0), (1, 2), (2, 4)]))
    assert loss.terms["hidden"].item() == pytest.approx(expected.item() / 3, rel=1e-5)
    assert loss.total.item() == pytest.approx((base + 1.5 * expected / 3).item(), rel=1e-5)
    loss.total.backward()
    assert all(p.weight.grad.abs().sum() > 0 for p in student.kd_projections)
    assert all(p.grad is None for p in teacher.parameters())  # the teacher stays frozen


def test_the_teacher_is_dropped_once_its_logits_are_cached(train):
    """With the cache, no teacher stays in the Distiller (on a GPU: its memory would be charged to
    the student's peak); the loss then comes from the cache alone. A live teacher stays."""
    from pipeline import models

    task = get_task("sentiment")
    examples = train[:32]
    tokenizer, teacher = models.build("preset:bangla-tiny", task, task.texts(train), {}, 48)
    features = task.featurize(examples, tokenizer, 48, "train")
    collate = task.collator(tokenizer)
    for attempt in ("miss", "hit"):
        d = make_distiller(teacher)
        d.prepare(features, collate, 48, tokenizer)
        assert d.cache_hit is (attempt == "hit") and d.teacher is None
    batch = collate([features[i] for i in range(4)])
    idx = batch.pop("idx")
    outputs = teacher(**batch)  # any student of the right shape
    d.watch_student(teacher)
    assert torch.isfinite(d.loss(outputs, batch, idx).total)
    live = make_distiller(teacher, ["kd.cache=false"])
    live.prepare(features, collate, 48, tokenizer)
    assert live.teacher is teacher and live.cached is None


def test_relation_kl_matches_a_hand_computed_case_and_ignores_padding():
    """One row, one relation head, width 1: relations softmax(x_i x_j) over the two real keys."""
    mask = torch.tensor([[1, 1, 0]])
    student = torch.tensor([[[1.0], [0.0], [5.0]]])
    teacher = torch.tensor([[[2.0], [1.0], [-7.0]]])
    # student rows: [1, 0] -> softmax [e/(e+1), 1/(e+1)]; [0, 0] -> [1/2, 1/2]
    # teacher rows: [4, 2] -> softmax [e^2/(e^2+1), 1/(e^2+1)]; [2, 1] -> [e/(e+1), 1/(e+1)]
    e = math.e

    def kl(p, q):
        return sum(a * math.log(a / b) for a, b in zip(p, q))
    expected = (kl([e**2 / (e**2 + 1), 1 / (e**2 + 1)], [e / (e + 1), 1 / (e + 1)])
                + kl([e / (e + 1), 1 / (e + 1)], [0.5, 0.5])) / 2
    assert terms.relation_kl(student, teacher, 1, mask).item() == pytest.approx(expected, rel=1e-6)
    assert terms.relation_kl(teacher, teacher, 1, mask).item() == pytest.approx(0.0, abs=1e-7)


def test_relation_kl_takes_another_width_and_its_bf16_gradient_follows_fp32():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    teacher = torch.randn(2, 7, 48, generator=g)  # wider than the student, as a narrow student's teacher
    student = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    terms.relation_kl(student, teacher, 4, mask).backward()
    fp32 = student.grad.clone()
    low = student.detach().bfloat16().requires_grad_()
    loss = terms.relation_kl(low, teacher.bfloat16(), 4, mask)
    assert loss.dtype == torch.float32
    loss.backward()
    torch.testing.assert_close(low.grad.float(), fp32, rtol=0.05, atol=2e-3)
    with pytest.raises(UserError, match="kd.relation_heads=5: must divide the hidden size 32"):
        terms.relation_kl(student, teacher, 5, mask)


def test_attention_term_reads_qkv_from_hooks_adds_to_the_loss_by_name_and_trains_the_student():
    """A narrower student with other head counts: the relation term of the last layers' Q/K/V
    as the models ran (hooks), weighted into the total, returned as the `attention` term."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=50, num_labels=3)
    teacher = BertForSequenceClassification(BertConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, **sizes))
    student = BertForSequenceClassification(BertConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, **sizes))
    student.eval()
    batch = {"input_ids": torch.randint(5, 50, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 0])}
    batch["attention_mask"][0, 5:] = 0
    d = make_distiller(teacher, ["kd.cache=false", "kd.attention_weight=2.0"])
    d.watch_student(student)
    loss = d.loss(student(**batch), batch, torch.arange(4), student)
    assert sorted(loss.terms) == ["attention", "kd", "task"]
    with torch.no_grad():
        s_in = student.bert(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True)
        t_in = teacher.bert(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True)
        s_att, t_att = student.bert.encoder.layer[0].attention.self, teacher.bert.encoder.layer[1].attention.self
        s_h, t_h = s_in.hidden_states[0], t_in.hidden_states[1]
        expected = sum(terms.relation_kl(getattr(s_att, n)(s_h), getattr(t_att, n)(t_h), 2, batch["attention_mask"])
                       for n in terms.RELATIONS) / 3
    assert loss.terms["attention"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss.total.item() == pytest.approx(
        (0.5 * loss.terms["kd"] + 0.5 * loss.terms["task"] + 2.0 * loss.terms["attention"]).item(), rel=1e-5)
    loss.total.backward()
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


def test_layer_map_defaults_to_uniform_and_refuses_bad_maps_in_one_line():
    assert terms.layer_map(None, 3, 6) == [(1, 2), (2, 4), (3, 6)]  # TinyBERT's: i -> i*T/S
    assert terms.layer_map(None, 4, 12) == [(1, 3), (2, 6), (3, 9), (4, 12)]
    assert terms.layer_map(None, 2, 2) == [(1, 1), (2, 2)]
    assert terms.layer_map("1:2, 3:5", 3, 6) == [(1, 2), (3, 5)]
    for spec, reason in [("1-2", "expected student:teacher layer pairs, e.g. 1:2,2:4,3:6"),
                         ("1:2,2", "expected student:teacher layer pairs"), ("a:b", "expected student:teacher"),
                         ("4:6", "student layer 4 is out of range (the student has layers 1..3)"),
                         ("1:7", "teacher layer 7 is out of range (the teacher has layers 1..6)"),
                         ("0:0", "student layer 0 is out of range"),
                         ("1:4,2:4", "the layers must increase on both sides"),
                         ("2:2,1:4", "the layers must increase on both sides")]:
        with pytest.raises(UserError, match=re.escape(f"config: kd.layer_map={spec}: {reason}")):
            terms.layer_map(spec, 3, 6)


def test_a_layer_map_is_checked_when_set_even_with_no_layer_wise_term_on():
    """Both layer-wise weights 0 (the defaults): the map is read by no term, yet a malformed one is
    refused as the config loads and one out of the models' range as the student is watched."""
    with pytest.raises(UserError, match=re.escape("config: kd.layer_map=garbage: expected student:teacher")):
        load_config(None, ["kd.layer_map=garbage"])
    with pytest.raises(UserError, match=re.escape("config: kd.layer_map=2:3,1:4: the layers must increase")):
        load_config(None, ["kd.layer_map=2:3,1:4"])
    d = make_distiller(bert(4, 16, 4), ["kd.cache=false", "kd.layer_map=1:2,3:4"])
    with pytest.raises(UserError, match=re.escape("config: kd.layer_map=1:2,3:4: student layer 3 is out of range")):
        d.watch_student(bert(2, 8, 2, seed=1))


def bert(layers, width, heads, seed=0):
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=width, intermediate_size=2 * width,
                                                    num_hidden_layers=layers, num_attention_heads=heads,
                                                    num_labels=3)).eval()


def sample_batch():
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(5, 50, (4, 7), generator=g),
             "attention_mask": torch.ones(4, 7, dtype=torch.long), "labels": torch.tensor([0, 1, 2, 0])}
    batch["attention_mask"][0, 5:] = 0
    return batch


def test_every_term_is_zero_for_a_student_with_the_teachers_weights():
    teacher, student = bert(3, 16, 4), bert(3, 16, 4)
    student.load_state_dict(teacher.state_dict())
    d = make_distiller(teacher, ["kd.cache=false", "kd.hidden_weight=1", "kd.attention_weight=1"])
    d.watch_student(student)
    assert d.layer_pairs == [(1, 1), (2, 2), (3, 3)] and not hasattr(student, "kd_projections")  # same width
    batch = sample_batch()
    loss = d.loss(student(**batch, **d.forward_kwargs), batch, torch.arange(4), student)
    assert sorted(loss.terms) == ["attention", "hidden", "kd", "task"]
    for name in ("kd", "hidden", "attention"):
        assert loss.terms[name].item() == pytest.approx(0.0, abs=1e-6), name
    assert all(v.dtype == torch.float32 for v in loss.terms.values())


def test_attention_term_is_the_mean_over_the_mapped_layers():
    """kd.layer_map=1:2,2:4 of a 2-layer student and a 4-layer teacher: the relation KL of
    student layer 1 against teacher layer 2 and of 2 against 4, read from the hooks."""
    teacher, student = bert(4, 16, 4, seed=0), bert(2, 8, 2, seed=1)
    batch = sample_batch()
    d = make_distiller(teacher, ["kd.cache=false", "kd.attention_weight=1", "kd.layer_map=1:2,2:4",
                                 "kd.relation_heads=2"])
    d.watch_student(student)
    loss = d.loss(student(**batch), batch, torch.arange(4), student)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s_in = student.bert(**inputs, output_hidden_states=True).hidden_states
        t_in = teacher.bert(**inputs, output_hidden_states=True).hidden_states
        per_layer = []
        for s, t in [(1, 2), (2, 4)]:
            s_att = student.bert.encoder.layer[s - 1].attention.self
            t_att = teacher.bert.encoder.layer[t - 1].attention.self
            per_layer += [terms.relation_kl(getattr(s_att, n)(s_in[s - 1]), getattr(t_att, n)(t_in[t - 1]), 2,
                                            batch["attention_mask"]) for n in terms.RELATIONS]
    assert loss.terms["attention"].item() == pytest.approx(sum(per_layer).item() / 6, rel=1e-5)


def test_layer_terms_gradient_under_bf16_autocast_follows_fp32():
    """The student's gradient from the hidden and attention terms with the forward under bf16
    autocast (as a bf16 job runs it) stays close to the fp32 one: the terms are computed in fp32."""
    teacher, student = bert(2, 16, 4, seed=0), bert(2, 8, 2, seed=1)
    batch = sample_batch()
    grads = {}
    for precision in ("fp32", "bf16"):
        cfg = load_config(None, ["kd.cache=false", "kd.hidden_weight=1", "kd.attention_weight=1", "kd.alpha=0"])
        d = distill.Distiller(cfg.kd, 8, get_task("sentiment"), PrecisionPolicy(precision, "cpu"), CPU, teacher)
        torch.manual_seed(2)  # the same projections in both
        d.watch_student(student)
        student.zero_grad()
        with d.policy.autocast():
            outputs = student(**batch, **d.forward_kwargs)
        loss = d.loss(outputs, batch, torch.arange(4), student)
        (loss.terms["hidden"] + loss.terms["attention"]).backward()
        grads[precision] = student.bert.encoder.layer[0].attention.self.query.weight.grad.clone()
        del student.kd_projections
    assert grads["fp32"].abs().sum() > 0
    torch.testing.assert_close(grads["bf16"], grads["fp32"], rtol=0.1, atol=0.1 * grads["fp32"].abs().max().item())


def test_relation_heads_that_do_not_divide_a_width_are_refused_at_set_up():
    d = make_distiller(bert(2, 16, 4), ["kd.cache=false", "kd.attention_weight=1", "kd.relation_heads=3"])
    with pytest.raises(UserError, match="kd.relation_heads=3: must divide the teacher's attention width 16"):
        d.watch_student(bert(2, 12, 3))
    d = make_distiller(bert(2, 16, 4), ["kd.cache=false", "kd.attention_weight=1"])  # the student's 3 heads
    with pytest.raises(UserError, match="kd.relation_heads=3: must divide the teacher's attention width 16"):
        d.watch_student(bert(2, 12, 3))


def test_projections_are_the_students_parameters_and_round_trip_through_its_state_dict():
    """What the optimizer steps (named_parameters) and what a checkpoint saves and resume loads
    (state_dict) hold each projection; a student given the same set-up takes them back exactly."""
    teacher = bert(4, 16, 4)
    d = make_distiller(teacher, ["kd.cache=false", "kd.hidden_weight=1", "kd.layer_map=2:4"])
    student = bert(2, 8, 2, seed=1)
    d.watch_student(student)
    assert len(student.kd_projections) == 2  # the embeddings' 0:0 and 2:4
    names = {n for n, _ in student.named_parameters()}
    assert {f"kd_projections.{k}.{p}" for k in range(2) for p in ("weight", "bias")} <= names
    saved = student.state_dict()
    resumed = bert(2, 8, 2, seed=2)
    make_distiller(teacher, ["kd.cache=false", "kd.hidden_weight=1", "kd.layer_map=2:4"]).watch_student(resumed)
    assert not torch.equal(resumed.kd_projections[1].weight, student.kd_projections[1].weight)
    resumed.load_state_dict(saved)
    assert all(torch.equal(a.weight, b.weight) for a, b in zip(resumed.kd_projections, student.kd_projections))


def test_a_bad_layer_map_or_projections_under_zero3_are_refused_before_training(train, tmp_path):
    """kd.layer_map is checked against both models as the stage is set up; a student of another
    width under ZeRO-3 is refused there too (its projections run outside the engine's forward)."""
    import dataclasses

    from pipeline import models

    task = get_task("sentiment")
    texts = task.texts(train)
    tokenizer, teacher = models.build("preset:bangla-small", task, texts, {}, 48)  # 4 layers, width 256
    teacher.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    job = ["model=preset:bangla-tiny", f"kd.teacher={tmp_path}", "train.max_length=48", "kd.hidden_weight=1"]
    fp32 = PrecisionPolicy("fp32", "cpu")
    single = TorchBackend(CPU, fp32, 1.0)
    with pytest.raises(UserError, match=r"^config: kd.layer_map=1:2,3:4: student layer 3 is out of range"):
        distill.build_distillation(load_config(None, [*job, "kd.layer_map=1:2,3:4"]), task, fp32, CPU, single, texts)
    ds = dataclasses.replace(CPU, backend="deepspeed")
    zero3, zero2 = (make_backend(ds, fp32, OFF, settled_train(*job), f"zero{n}.json") for n in (3, 2))
    with pytest.raises(UserError, match=r"kd.hidden_weight=1.0: a student of another width than its teacher "
                                        r"\(128 vs 256\) needs learned projections, which DeepSpeed ZeRO-3"):
        distill.build_distillation(load_config(None, [*job, "deepspeed=zero3.json"]), task, fp32, ds, zero3, texts)
    _, _, student, d = distill.build_distillation(load_config(None, [*job, "deepspeed=zero2.json"]), task, fp32,
                                                  ds, zero2, texts)
    assert d.layer_pairs == [(1, 2), (2, 4)] and len(student.kd_projections) == 3
