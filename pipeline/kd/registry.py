"""The distillation terms, by name (TERMS): what the distiller computes, from this table alone. An
entry says the term's name (logged as train/loss_<name>), its weight's KDConfig field, what of the
teacher it reads (its logits, from the cache or a live teacher; its hidden states; its Q/K/V, read by
hooks: all but the logits need the teacher live, as the cache holds logits only) and how it is built
for a student and its teacher. A term whose weight is 0 is off; the KD term is always computed
(loss_kd is logged at kd.alpha=0 too, as loss_task at kd.alpha=1).

A new term: its function (kd/terms.py), its entry here, its weight in KDConfig (then regenerate
docs/configuration.md: python -m pipeline config-reference > docs/configuration.md), its weight in
the README's distill paragraph and its train/loss_<name> in docs/outputs.md (a unit test checks the
docs name every term here).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipeline.errors import UserError
from pipeline.kd import terms

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.utils import ModelOutput

    from pipeline.config import KDConfig
    from pipeline.runtime.precision import PrecisionPolicy
    from pipeline.tasks.base import Task

LOGITS, HIDDEN_STATES, QKV = "logits", "hidden_states", "qkv"
"""What of the teacher a term reads; HIDDEN_STATES is also the teacher outputs' key for them."""

Compute = Callable[["ModelOutput", dict, dict, torch.nn.Module], torch.Tensor]
"""A built term: (student outputs, teacher outputs by name, the micro-batch, the unwrapped student)
-> the term, unweighted, in fp32."""

Build = Callable[["KDConfig", "Task", "PrecisionPolicy", "PreTrainedModel", torch.nn.Module], Compute]
"""(kd, task, policy, student, teacher) -> the term's Compute, at set-up (before the student's
optimizer exists): every check that can be the user's fault happens here."""


@dataclass(frozen=True)
class Term:
    """One distillation term, as the distiller reads it."""

    name: str
    """Its key in the loss's terms, logged as train/loss_<name>."""
    weight: str
    """Its weight's KDConfig field (0 = off, unless `always`)."""
    needs: str
    """What of the teacher it reads: LOGITS, HIDDEN_STATES or QKV."""
    build: Build
    layer_wise: bool = False
    """Over kd.layer_map's layer pairs."""
    always: bool = False
    """Computed and logged whatever its weight."""

    @property
    def live(self) -> bool:
        """Whether the teacher must run every step (the cache holds logits only)."""
        return self.needs != LOGITS


def layer_pairs(kd: KDConfig, student: PreTrainedModel, teacher: torch.nn.Module) -> list[tuple[int, int]]:
    """kd.layer_map checked against both models: the layer-wise terms' (student, teacher) layers."""
    return terms.layer_map(kd.layer_map, student.config.num_hidden_layers, teacher.config.num_hidden_layers)


def kd_term(kd: KDConfig, task: Task, policy: PrecisionPolicy, student: PreTrainedModel, teacher: torch.nn.Module
            ) -> Compute:
    """The KD term over the logits Task.kd_pairs pairs up, their mean."""
    def compute(student_outputs: ModelOutput, teacher_outputs: dict, batch: dict, _: torch.nn.Module) -> torch.Tensor:
        pairs = task.kd_pairs(student_outputs, teacher_outputs, batch)
        return sum(terms.kd_loss(s, t, kd.temperature) for s, t in pairs) / len(pairs)
    return compute


def hidden_term(kd: KDConfig, task: Task, policy: PrecisionPolicy, student: PreTrainedModel,
                teacher: torch.nn.Module) -> Compute:
    """The hidden-state term over the mapped layers and the embeddings' output (0 -> 0), their
    mean; the student's `kd_projections` attached here when the widths differ."""
    pairs = [(0, 0), *layer_pairs(kd, student, teacher)]  # TinyBERT's embedding-layer term: 0 -> 0
    projected = terms.attach_projections(student, teacher, len(pairs))

    def compute(student_outputs: ModelOutput, teacher_outputs: dict, batch: dict, model: torch.nn.Module
                ) -> torch.Tensor:
        per_layer = []
        for k, (s, t) in enumerate(pairs):
            hidden = student_outputs.hidden_states[s]
            if projected:
                with policy.autocast():
                    hidden = model.kd_projections[k](hidden)
            per_layer.append(terms.hidden_mse(hidden, teacher_outputs[HIDDEN_STATES][t], batch["attention_mask"]))
        return torch.stack(per_layer).mean()
    return compute


def attention_term(kd: KDConfig, task: Task, policy: PrecisionPolicy, student: PreTrainedModel,
                   teacher: torch.nn.Module) -> Compute:
    """The attention-relation term over the mapped layers' Q, K and V, their mean; hooks on both
    models' query/key/value projections of those layers record them as the models run."""
    pairs = layer_pairs(kd, student, teacher)
    student_layers = terms.layer_projections(student, "kd.attention_weight")
    teacher_layers = terms.layer_projections(teacher, "kd.attention_weight")
    heads = kd.relation_heads or student.config.num_attention_heads
    for who, layers in (("student", student_layers), ("teacher", teacher_layers)):
        width = layers[max(layers)]["query"].out_features
        if width % heads:
            raise UserError(f"config: kd.relation_heads={heads}: must divide the {who}'s attention width {width}")
    student_qkv = terms.recorder({(s, n): student_layers[s][n] for s, _ in pairs for n in terms.RELATIONS})
    teacher_qkv = terms.recorder({(t, n): teacher_layers[t][n] for _, t in pairs for n in terms.RELATIONS})

    def compute(student_outputs: ModelOutput, teacher_outputs: dict, batch: dict, _: torch.nn.Module
                ) -> torch.Tensor:
        s_seen, t_seen = student_qkv(), teacher_qkv()
        return torch.stack([terms.relation_kl(s_seen[(s, n)], t_seen[(t, n)], heads, batch["attention_mask"])
                            for s, t in pairs for n in terms.RELATIONS]).mean()
    return compute


KD = Term("kd", "alpha", LOGITS, kd_term, always=True)
HIDDEN = Term("hidden", "hidden_weight", HIDDEN_STATES, hidden_term, layer_wise=True)
ATTENTION = Term("attention", "attention_weight", QKV, attention_term, layer_wise=True)
TERMS: dict[str, Term] = {t.name: t for t in (KD, HIDDEN, ATTENTION)}
"""Every term by name, in the order the distiller builds and adds them."""


def on(kd: KDConfig) -> list[Term]:
    """The terms `kd` turns on: those of a non-zero weight, and those always computed."""
    return [t for t in TERMS.values() if t.always or getattr(kd, t.weight)]
