"""The distillation loss terms, each in fp32 whatever dtype its inputs come in: the KD term
(logits), and the layer-wise terms of kd.layer_map's layer pairs: hidden (TinyBERT: MSE of the
mapped hidden states and of the embeddings' output, through a learned projection per pair when the
widths differ) and attention (MiniLMv2: KL of the query-query, key-key and value-value
self-attention relations of the mapped layers, over relation heads, so widths and head counts may
differ). Q, K and V are read by forward hooks on each mapped layer's query/key/value projections as
the model runs: the attention kernel (SDPA or flash) is left alone.

A new term is a function here and a name in LayerTerms.terms; the loop logs it as train/loss_<name>.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from pipeline.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.utils import ModelOutput

    from pipeline.config import KDConfig
    from pipeline.runtime.precision import PrecisionPolicy

RELATIONS = ("query", "key", "value")


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(teacher || student) at temperature T, averaged over rows, in fp32."""
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * temperature**2


def hidden_mse(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real (mask == 1) tokens and the hidden dimension, in fp32."""
    mask = mask.unsqueeze(-1).float()
    squared = (student_hidden.float() - teacher_hidden.float()).pow(2) * mask
    return squared.sum() / (mask.sum() * student_hidden.shape[-1]).clamp(min=1)


def self_relation(states: torch.Tensor, heads: int, mask: torch.Tensor) -> torch.Tensor:
    """MiniLMv2's self-attention relation of one of Q, K or V [B, L, D]: split into `heads`
    relation heads of D/heads, log softmax(X X^T / sqrt(D/heads)) over the real (mask == 1) keys,
    [B, heads, L, L], in fp32. Its shape does not depend on D, so teacher and student may differ in
    width and attention heads."""
    b, length, width = states.shape
    if width % heads:
        raise UserError(f"config: kd.relation_heads={heads}: must divide the hidden size {width}")
    x = states.float().view(b, length, heads, width // heads).transpose(1, 2)
    scores = x @ x.transpose(-1, -2) / math.sqrt(width // heads)
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    return F.log_softmax(scores, dim=-1)


def relation_kl(student: torch.Tensor, teacher: torch.Tensor, heads: int, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher relation || student relation) of one of Q, K, V, averaged over the real
    queries and the relation heads (MiniLMv2), in fp32."""
    s, t = self_relation(student, heads, mask), self_relation(teacher, heads, mask)
    keys = mask.bool()[:, None, None, :]
    per_query = (t.exp() * (t - s)).masked_fill(~keys, 0.0).sum(-1)  # [B, heads, L]
    queries = mask.float()[:, None, :]
    return (per_query * queries).sum() / (queries.sum() * heads).clamp(min=1)


def layer_map(spec: str | None, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """kd.layer_map as (student layer, teacher layer) pairs, numbered from 1 (hidden_states[i] is
    layer i's output); unset: TinyBERT's uniform map, student layer i -> teacher layer i*T/S (the
    last to the last). A UserError names a malformed map, a layer out of range, or pairs that do
    not increase on both sides."""
    if not spec:
        return [(i, max(1, i * teacher_layers // student_layers)) for i in range(1, student_layers + 1)]
    where = f"config: kd.layer_map={spec}"
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in str(spec).split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise UserError(f"{where}: expected student:teacher layer pairs, e.g. 1:2,2:4,3:6")
    for (s, t) in pairs:
        for side, layer, total in (("student", s, student_layers), ("teacher", t, teacher_layers)):
            if not 1 <= layer <= total:
                raise UserError(f"{where}: {side} layer {layer} is out of range (the {side} has layers 1..{total})")
    if any(a[0] >= b[0] or a[1] >= b[1] for a, b in zip(pairs, pairs[1:])):
        raise UserError(f"{where}: the layers must increase on both sides")
    return pairs


def layer_projections(model: torch.nn.Module, what: str) -> dict[int, dict[str, torch.nn.Linear]]:
    """Encoder layer (from 1) -> its query, key and value projections (nn.Linear); a UserError
    (`what` names the setting) where the model has none."""
    found: dict[int, dict[str, torch.nn.Linear]] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if isinstance(module, torch.nn.Linear) and parts[-1] in RELATIONS and "layer" in parts:
            index = parts[parts.index("layer") + 1]
            if index.isdigit():
                found.setdefault(int(index) + 1, {})[parts[-1]] = module
    if not found or any(set(v) != set(RELATIONS) for v in found.values()):
        raise UserError(f"config: {what}: {type(model).__name__} has no query/key/value projections "
                        "in encoder layers to read attention relations from")
    return found


class Recorder:
    """The outputs of the modules it hooks, by key, as the model computes them (with their graph,
    for the student)."""

    def __init__(self, modules: dict[Hashable, torch.nn.Module]) -> None:
        self.seen: dict[Hashable, torch.Tensor] = {}
        for key, module in modules.items():
            module.register_forward_hook(lambda _m, _i, out, key=key: self.seen.__setitem__(key, out))

    def take(self) -> dict[Hashable, torch.Tensor]:
        seen, self.seen = self.seen, {}
        return seen


class LayerTerms:
    """The layer-wise terms of one student and its teacher. Built at set-up (every check that can
    be the user's fault happens here): the layer map, the Q/K/V hooks, and the student's
    `kd_projections` (one student-width -> teacher-width nn.Linear per hidden-state pair, when the
    widths differ): a submodule of the student, so they are in its optimizer, sync under DDP and
    DeepSpeed, and save and restore with its checkpoints; save_pretrained leaves them out."""

    def __init__(self, kd: KDConfig, student: PreTrainedModel, teacher: torch.nn.Module, policy: PrecisionPolicy
                 ) -> None:
        self.hidden_weight, self.attention_weight, self.policy = kd.hidden_weight, kd.attention_weight, policy
        self.pairs = layer_map(kd.layer_map, student.config.num_hidden_layers, teacher.config.num_hidden_layers)
        self.hidden_pairs = [(0, 0), *self.pairs]  # TinyBERT's embedding-layer term: 0 -> 0
        self.projected = self.hidden_weight > 0 and attach_projections(student, teacher, len(self.hidden_pairs))
        self.student_qkv = self.teacher_qkv = None
        self.heads = 0
        if self.attention_weight:
            student_layers = layer_projections(student, "kd.attention_weight")
            teacher_layers = layer_projections(teacher, "kd.attention_weight")
            self.heads = kd.relation_heads or student.config.num_attention_heads
            for who, layers in (("student", student_layers), ("teacher", teacher_layers)):
                width = layers[max(layers)]["query"].out_features
                if width % self.heads:
                    raise UserError(f"config: kd.relation_heads={self.heads}: must divide the {who}'s "
                                    f"attention width {width}")
            self.student_qkv = Recorder({(s, n): student_layers[s][n] for s, _ in self.pairs for n in RELATIONS})
            self.teacher_qkv = Recorder({(t, n): teacher_layers[t][n] for _, t in self.pairs for n in RELATIONS})

    def teacher_hidden(self, outputs: ModelOutput) -> list[torch.Tensor]:
        """The teacher's hidden states of the hidden-state pairs."""
        return [outputs.hidden_states[t] for _, t in self.hidden_pairs]

    def terms(self, student_outputs: ModelOutput, teacher_hidden: list[torch.Tensor] | None, mask: torch.Tensor,
              student: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Each term on, by name, unweighted (a mean over its layer pairs), in fp32; `student` is
        the unwrapped student (its kd_projections)."""
        terms = {}
        if self.hidden_weight:
            per_layer = []
            for k, (s, _) in enumerate(self.hidden_pairs):
                hidden = student_outputs.hidden_states[s]
                if self.projected:
                    with self.policy.autocast():
                        hidden = student.kd_projections[k](hidden)
                per_layer.append(hidden_mse(hidden, teacher_hidden[k], mask))
            terms["hidden"] = torch.stack(per_layer).mean()
        if self.attention_weight:
            student_qkv, teacher_qkv = self.student_qkv.take(), self.teacher_qkv.take()
            terms["attention"] = torch.stack([relation_kl(student_qkv[(s, n)], teacher_qkv[(t, n)], self.heads, mask)
                                              for s, t in self.pairs for n in RELATIONS]).mean()
        return terms

    def weighted(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """The terms' share of the total loss."""
        weights = {"hidden": self.hidden_weight, "attention": self.attention_weight}
        return sum(weights[name] * value for name, value in terms.items())


def attach_projections(student: PreTrainedModel, teacher: torch.nn.Module, count: int) -> bool:
    """`count` learned student-width -> teacher-width maps as the student's `kd_projections`
    (when the widths differ): they train, sync and checkpoint with it; save_pretrained leaves them out."""
    width, teacher_width = student.config.hidden_size, teacher.config.hidden_size
    if width == teacher_width:
        return False
    student.kd_projections = torch.nn.ModuleList(torch.nn.Linear(width, teacher_width) for _ in range(count))
    student._keys_to_ignore_on_save = set(student._keys_to_ignore_on_save or ()) | {
        f"kd_projections.{k}.{p}" for k in range(count) for p in ("weight", "bias")}
    return True
