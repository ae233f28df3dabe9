"""The distillation loss terms, each in fp32 whatever dtype its inputs come in: the KD term
(logits), and the layer-wise terms of kd.layer_map's layer pairs: hidden (TinyBERT: MSE of the
mapped hidden states and of the embeddings' output, through a learned projection per pair when the
widths differ) and attention (MiniLMv2: KL of the query-query, key-key and value-value
self-attention relations of the mapped layers, over relation heads, so widths and head counts may
differ). Q, K and V are read by forward hooks on each mapped layer's query/key/value projections as
the model runs: the attention kernel (SDPA or flash) is left alone.

The distiller reads them through kd/registry.py, which says what each needs and how it is weighted.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from pipeline.config.sections import layer_pairs
from pipeline.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
    pairs = layer_pairs(spec)
    for (s, t) in pairs:
        for side, layer, total in (("student", s, student_layers), ("teacher", t, teacher_layers)):
            if layer > total:
                raise UserError(f"config: kd.layer_map={spec}: {side} layer {layer} is out of range (the {side} "
                                f"has layers 1..{total})")
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


def recorder(modules: dict[Hashable, torch.nn.Module]) -> Callable[[], dict[Hashable, torch.Tensor]]:
    """Forward hooks on `modules`; the function returned hands over the outputs they saw since its
    last call, by key, as the model computed them (with their graph, for the student)."""
    seen: dict[Hashable, torch.Tensor] = {}
    for key, module in modules.items():
        module.register_forward_hook(lambda _m, _i, out, key=key: seen.__setitem__(key, out))

    def take() -> dict[Hashable, torch.Tensor]:
        taken = dict(seen)
        seen.clear()
        return taken
    return take


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
