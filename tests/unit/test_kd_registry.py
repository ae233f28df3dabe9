"""The distillation terms' registry (kd/registry.py): the distiller computes, weighs and logs every
term registered there whose weight is on, with nothing else to edit, and the docs name every term."""
import dataclasses

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from helpers import ROOT
from pipeline import names
from pipeline.config import KDConfig, load_config
from pipeline.job.parts.step_losses import StepLosses
from pipeline.kd import distill, registry
from pipeline.layout import OutputDir
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


def doc(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


@pytest.mark.parametrize("term", registry.TERMS.values(), ids=list(registry.TERMS))
def test_every_registered_term_is_a_weight_and_named_in_the_docs(term):
    assert term.weight in {f.name for f in dataclasses.fields(KDConfig)}, term
    assert f"| `kd.{term.weight}` |" in doc("docs/configuration.md"), "regenerate: python -m pipeline config-reference"
    assert f"kd.{term.weight}" in doc("README.md")
    outputs = doc("docs/outputs.md")
    assert f"loss_{term.name}" in outputs
    if not term.always:  # docs/outputs.md says which weight logs it
        assert f"`loss_{term.name}` with `kd.{term.weight}`" in outputs
    if term.layer_wise:  # kd.layer_map's doc names the terms it maps
        rows = doc("docs/configuration.md").splitlines()
        (layer_map,) = [row for row in rows if row.startswith("| `kd.layer_map` |")]
        assert f"kd.{term.weight}" in layer_map


def bert(layers: int, width: int, seed: int) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=width, intermediate_size=2 * width,
                                                    num_hidden_layers=layers, num_attention_heads=2,
                                                    num_labels=3)).eval()


def squared_gap(kd, task, policy, student, teacher):
    """A throwaway term: the mean squared gap of the logits, or of the last hidden states."""
    def compute(student_outputs, teacher_outputs, batch, model):
        if registry.HIDDEN_STATES in teacher_outputs:
            return (student_outputs.hidden_states[-1] - teacher_outputs[registry.HIDDEN_STATES][-1]).pow(2).mean()
        return (student_outputs.logits - teacher_outputs["logits"]).float().pow(2).mean()
    return compute


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")  # no optimizer steps here
@pytest.mark.parametrize("needs", [registry.LOGITS, registry.HIDDEN_STATES])
def test_a_registered_term_is_computed_weighted_and_logged_with_nothing_else_edited(monkeypatch, tmp_path, needs):
    monkeypatch.setitem(registry.TERMS, "gap", registry.Term("gap", "gap_weight", needs, squared_gap))
    kd = load_config(None, ["kd.alpha=0.25"]).kd
    kd.gap_weight = 3.0  # its weight, as a KDConfig field would hold it
    teacher, student = bert(2, 16, 0), bert(2, 16, 1)

    def distiller():
        return distill.Distiller(kd, 8, get_task("sentiment"), PrecisionPolicy("fp32", "cpu"), CPU, teacher)
    assert distiller().use_cache is (needs == registry.LOGITS)  # the cache holds logits only
    kd.cache = False  # the teacher live: no cache pass here
    d = distiller()
    assert bool(d.forward_kwargs) is (needs == registry.HIDDEN_STATES)
    d.watch_student(student)
    batch = {"input_ids": torch.randint(5, 50, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 0])}
    outputs = student(**batch, **d.forward_kwargs)
    loss = d.loss(outputs, batch, torch.arange(4), student)
    assert sorted(loss.terms) == ["gap", "kd", "task"]
    with torch.no_grad():
        theirs = teacher(**batch, output_hidden_states=True)
        gap = (outputs.hidden_states[-1] - theirs.hidden_states[-1] if needs == registry.HIDDEN_STATES
               else outputs.logits - theirs.logits).pow(2).mean()
    assert loss.terms["gap"].item() == pytest.approx(gap.item(), rel=1e-5)
    assert loss.total.item() == pytest.approx(
        (0.75 * loss.terms["task"] + 0.25 * loss.terms["kd"] + 3.0 * gap).item(), rel=1e-5)

    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(student.parameters(), lr=0.1), lambda _: 1.0)
    losses = StepLosses(scheduler, OutputDir(tmp_path), 1, 3)
    losses.add(loss.detach(), True)
    losses.read(1)
    losses.close_window()
    assert losses.figures()[names.train_loss_term("gap")] == pytest.approx(gap.item(), rel=1e-5)

    kd.gap_weight = 0.0  # off: neither computed nor logged
    assert [t.name for t in distiller().terms] == ["kd"]
