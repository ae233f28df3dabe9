"""The student a distill stage builds from its teacher (`model=from_teacher:N`, with
model_config.hidden_size, num_attention_heads and intermediate_size for a narrower one), initialised
from the teacher's weights, and what it costs against the teacher.

Depth: N of the teacher's layers, evenly spaced (DistilBERT took every other layer of BERT-base:
0, 2, ..., 10 for N=6). Width: hidden_size unset is the teacher's; heads unset keep the teacher's
head size (hidden_size / its head size), the feed-forward size unset its ratio to the hidden size
(parts/model_card.student_width, which the model card reads too). At the teacher's width the chosen layers
are copied whole (init `teacher-layers`); narrower, every tensor takes the teacher's matching slice
(init `weight-selection`, Xu et al. 2023, "Initializing Models with Larger Ones"): the same evenly
spaced indices of the hidden dimension in every tensor (embeddings, LayerNorms, pooler, head
included), so the residual stream keeps one consistent subset; evenly spaced feed-forward units; and
for attention evenly spaced whole heads, each keeping its first head-size dimensions (all of them
when the head size is the teacher's). A width that cannot be sliced so is refused before anything is
written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pipeline import names
from pipeline.errors import UserError
from pipeline.measure.flops import ModelSize
from pipeline.models import heads_refusal

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from pipeline.tasks.base import Task

PREFIX = "from_teacher:"
WIDTHS = {"hidden_size": "hidden size", "num_attention_heads": "attention heads", "intermediate_size": "feed-forward"}
"""The model_config keys that narrow a from_teacher student, as the card names them."""
WIDTH_KEYS = tuple(WIDTHS)
"""model_config keys that shape a from_teacher student and not its teacher."""
TEACHER_LAYERS, WEIGHT_SELECTION, SCRATCH, PRETRAINED = "teacher-layers", "weight-selection", "scratch", "pretrained"


def spaced_layers(n_layers: int, total: int) -> list[int]:
    """The teacher's layers a from_teacher:N student starts from: N evenly spaced of `total`
    (DistilBERT took every other layer of BERT-base: 0, 2, ..., 10 for N=6)."""
    return [i * total // n_layers for i in range(n_layers)]


def student_width(overrides: dict, teacher: dict) -> dict[str, int]:
    """A from_teacher student's hidden size, heads and feed-forward size from model_config
    `overrides` and the teacher's config: unset heads keep the teacher's head size (hidden size /
    the teacher's head size, at least 1), an unset feed-forward size the teacher's ratio to width."""
    hidden = overrides.get("hidden_size", teacher["hidden_size"])
    head_size = teacher["hidden_size"] // teacher["num_attention_heads"]
    return {"hidden_size": hidden,
            "num_attention_heads": overrides.get("num_attention_heads", max(1, hidden // head_size)),
            "intermediate_size": overrides.get("intermediate_size",
                                               teacher["intermediate_size"] * hidden // teacher["hidden_size"])}


def is_from_teacher(spec: str | None) -> bool:
    """Whether `model` (unset: a distill stage's default) builds the student from the teacher."""
    return spec is None or spec.startswith(PREFIX)


def teacher_overrides(spec: str | None, model_config: dict) -> dict:
    """The model_config a from_teacher student's teacher loads with: all but the student's width keys
    (the student copies the rest from the teacher's config); a depth override is refused (N gives it)."""
    if not is_from_teacher(spec):
        return model_config
    if "num_hidden_layers" in model_config:
        raise UserError(f"config: model_config.num_hidden_layers: a from_teacher student's depth is N in "
                        f"model=from_teacher:N (model={spec or 'unset'})")
    return {k: v for k, v in model_config.items() if k not in WIDTH_KEYS}


def from_teacher(spec: str, teacher: PreTrainedModel, task: Task, model_config: dict) -> PreTrainedModel:
    """The student `spec` (from_teacher:N) with model_config's width keys, initialised from the
    teacher (see the module docstring), in fp32 whatever the teacher's dtype."""
    try:
        n_layers = int(spec.removeprefix(PREFIX))
    except ValueError:
        raise UserError(f"config: model={spec}: expected from_teacher:N with N a number of layers") from None
    total = teacher.config.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise UserError(f"config: model={spec}: the teacher has {total} layers")
    theirs = teacher.config.to_dict()
    width = _width(spec, model_config, theirs)
    config = teacher.config.__class__.from_dict({**theirs, **width, "num_hidden_layers": n_layers})
    kept = _kept(config, teacher.config, spec, model_config) if width else None
    student = task.model_class.from_config(config, dtype=torch.float32)
    source = teacher.state_dict()
    chosen = spaced_layers(n_layers, total)
    mapped = {}
    for key, tensor in student.state_dict().items():  # load_state_dict copies into the fp32 parameters
        teacher_key = _teacher_key(key, chosen)
        if teacher_key not in source:
            raise UserError(f"config: model={spec}: the student's {key} has no counterpart in the teacher to "
                            "initialise it from")
        mapped[key] = _sliced(key, source[teacher_key], tuple(tensor.shape), kept, spec) if kept else \
            source[teacher_key]
    student.load_state_dict(mapped)
    return student


def _width(spec: str, model_config: dict, teacher: dict) -> dict:
    """The student's width keys; none where the teacher's config has no such keys and none are
    given (the layers are copied whole). ELECTRA embeddings as wide as the teacher's hidden size
    narrow with it; narrower ones keep their size and their projection to the hidden size is sliced."""
    if not all(k in teacher for k in WIDTH_KEYS):
        if given := [k for k in WIDTH_KEYS if k in model_config]:
            raise UserError(f"config: model_config.{given[0]}: model={spec} narrows BERT-style teachers only "
                            f"(hidden_size, num_attention_heads, intermediate_size in config.json); "
                            f"this one is {teacher.get('model_type')}")
        return {}
    width = student_width(model_config, teacher)
    if teacher.get("embedding_size") == teacher["hidden_size"]:
        width["embedding_size"] = width["hidden_size"]
    return width


def _teacher_key(key: str, chosen: list[int]) -> str:
    if ".layer." not in key:
        return key
    head, _, rest = key.partition(".layer.")
    index, _, tail = rest.partition(".")
    return f"{head}.layer.{chosen[int(index)]}.{tail}" if index.isdigit() else key


def _kept(student: PretrainedConfig, teacher: PretrainedConfig, spec: str, given: dict
          ) -> dict[str, tuple[int, list[int]]]:
    """What a narrower student keeps of the teacher, per kind of dimension (hidden, heads: the
    attention output units, heads x head size, whole heads each its first dims; ffn): the teacher's
    size of it and the indices kept. A UserError names the width that cannot be sliced from the
    teacher's: the model_config key the user gave (`given`) and nearby values that would fit."""
    h, a, f = student.hidden_size, student.num_attention_heads, student.intermediate_size
    th, ta, tf = teacher.hidden_size, teacher.num_attention_heads, teacher.intermediate_size
    for key, value, most in (("hidden_size", h, th), ("num_attention_heads", a, ta), ("intermediate_size", f, tf)):
        if not 1 <= value <= most:
            raise UserError(f"config: model_config.{key}={value}: model={spec} takes at least 1 and at most "
                            f"the teacher's {most}")
    size, teacher_size = h // a, th // ta
    if h % a or size > teacher_size:
        derived = "num_attention_heads" not in given  # heads follow the width at the teacher's head size
        if derived:
            rule = (f"with model_config.num_attention_heads unset the student keeps the teacher's head size "
                    f"{teacher_size}, which must split it")
        elif h % a:
            rule = f"must divide the hidden size {h}"
        else:
            rule = f"heads of {size} dimensions (hidden_size {h} / {a}) are wider than the teacher's ({teacher_size})"

        def hidden_ok(width: int) -> bool:
            if derived:
                return width % teacher_size == 0
            return width % a == 0 and width // a <= teacher_size

        raise heads_refusal(given, h, a, rule, hidden_ok, lambda n: n <= ta and h // n <= teacher_size, th)
    heads = [head * teacher_size + d for head in spaced_layers(a, ta) for d in range(size)]
    return {"hidden": (th, spaced_layers(h, th)), "heads": (ta * teacher_size, heads),
            "ffn": (tf, spaced_layers(f, tf))}


def _sliced(key: str, tensor: torch.Tensor, shape: tuple[int, ...], kept: dict[str, tuple[int, list[int]]],
            spec: str) -> torch.Tensor:
    """The teacher's `tensor` cut to the student's `shape`: each dimension that differs takes the
    indices of its kind (_kind), which must be of the teacher's size of that kind."""
    for axis, (have, want) in enumerate(zip(tensor.shape, shape, strict=True)):
        if have == want:
            continue
        size, index = kept[_kind(key, axis, len(shape))]
        if have != size or len(index) != want:
            raise UserError(f"config: model={spec}: cannot slice the teacher's {key} {list(tensor.shape)} "
                            f"to the student's {list(shape)}")
        tensor = tensor.index_select(axis, torch.tensor(index))
    return tensor


def _kind(key: str, axis: int, dims: int) -> str:
    """The kind of a tensor's dimension, told by where the tensor sits: attention heads (query,
    key, value out; the attention output in), feed-forward units, else the hidden size."""
    attention_in = ".attention.self." in key and axis == 0
    attention_out = ".attention.output.dense.weight" in key and axis == 1
    if attention_in or attention_out:
        return "heads"
    ffn_in = ".intermediate.dense." in key and axis == 0
    ffn_out = ".output.dense.weight" in key and ".attention." not in key and axis == 1 and dims == 2
    return "ffn" if ffn_in or ffn_out else "hidden"


def init_of(spec: str, student: PretrainedConfig, teacher: PretrainedConfig) -> str:
    """How a distill stage's student started: the teacher's layers copied, sliced from the
    teacher (weight selection), a preset's random init, or a pretrained checkpoint."""
    if is_from_teacher(spec):
        narrower = any(getattr(student, k, None) != getattr(teacher, k, None) for k in WIDTH_KEYS)
        return WEIGHT_SELECTION if narrower else TEACHER_LAYERS
    return SCRATCH if spec.startswith("preset:") else PRETRAINED


def ratios(student: ModelSize, teacher: ModelSize) -> dict[str, float]:
    """The student's parameters (all, outside the embeddings) and forward FLOPs (where both were
    counted) over the teacher's."""
    counted = student.forward_flops is not None and teacher.forward_flops is not None
    return {names.KD_PARAM_RATIO: student.params / teacher.params,
            names.KD_PARAM_RATIO_NON_EMBEDDING: student.params_non_embedding / teacher.params_non_embedding,
            **({names.KD_FLOPS_RATIO: student.forward_flops / teacher.forward_flops} if counted else {})}
