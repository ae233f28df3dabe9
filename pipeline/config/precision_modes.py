"""The precision modes, each declared once: one PrecisionMode per `precision` value, in MODES.

A mode states what it computes in and holds the module's weights in, whether it autocasts and
scales the loss, the DeepSpeed blocks it runs as, what its model is served as, and the side of the
report's AMP table its runs land on. Every other module asks the mode; none switches on its name.
What needs torch (dtypes as tensors take them, autocast, GradScaler, the matmul mode, what a device
refuses, what `auto` picks) is runtime/precision.py's, from these declarations: the config layer,
the reference and the report read them without loading torch, so a dtype is named here as torch
spells its attribute (getattr(torch, name) where a tensor needs it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The values of the run's precision_mode tag (names.TAG_PRECISION_MODE): how 16-bit compute is
# done, so rows that differ in it never share a report column unlabeled.
AUTOCAST = "autocast"
"""fp32 weights, 16-bit matmuls per op under torch.autocast (reductions, softmax, norms, losses in fp32)."""
PURE16 = "pure16"
"""The module itself in 16 bit, fp32 master weights in the optimizer (DeepSpeed's fp16 mode, and
precision=bf16-pure): norms and losses read and write 16 bit."""
FP32 = "fp32"
"""No 16-bit compute (fp32 and tf32)."""

AUTO = "auto"
"""The `precision` value that lets the device choose (runtime/precision.py's AUTO_PICKS); its runs
are on the AMP side of the report whatever it picked."""
AMP, REFERENCE = "amp", "fp32"
"""The sides of the report's AMP table (report/compare.py's roles)."""

DS_OFF = {"fp16": {"enabled": False}, "bf16": {"enabled": False}, "torch_autocast": {"enabled": False}}
"""The DeepSpeed blocks of a mode without 16-bit compute."""


@dataclass(frozen=True)
class PrecisionMode:
    name: str
    """The `precision` value, and the run's precision tag."""
    compute: str
    """The matmuls' dtype: float32 | float16 | bfloat16."""
    arithmetic: str
    """The matmuls' number format, the column of a peak-FLOP/s table and what a device is checked
    for (runtime/precision.DEVICE_CHECKS): fp32 | tf32 | fp16 | bf16."""
    served_as: str
    """The mode its model is served in: a served model is cast whole to that mode's compute dtype."""
    weights: str = "float32"
    """The dtype the trained module holds its weights in; other than float32, the fp32 master
    weights live in the optimizer only (runtime/master_weights.py)."""
    autocast: bool = False
    """Ops run under torch.autocast to `compute`, the weights fp32 and cast per op."""
    loss_scaling: bool = False
    """Dynamic loss scaling (GradScaler): fp16's exponent range loses small gradients; bf16 has fp32's."""
    tf32: bool = False
    """float32 matmuls and convolutions may use TF32 tensor cores (else strict IEEE fp32)."""
    deepspeed: dict | None = field(default_factory=lambda: DS_OFF)
    """The DeepSpeed config blocks it runs as ({block: {key: value}}, filled where the file says
    "auto", refused where it disagrees); None: DeepSpeed cannot run it, as it keeps the fp32
    master weights in its own partitions, which a module held in 16 bit leaves no place for."""
    deepspeed_why: dict = field(default_factory=dict)
    """Why it sets a DeepSpeed key as it does, said to a config that disagrees ({"block.key": words})."""
    benched_on: tuple[str, ...] = ()
    """The device types whose inference bench measures it beside the stage's own precision (where
    the device runs it: runtime/precision.refusal)."""
    report: str = AMP
    """The side of the report's AMP table a run that asks for it lands on."""

    @property
    def precision_mode(self) -> str:
        """How 16-bit compute is done under this mode with the torch backend."""
        return PURE16 if self.weights != "float32" else AUTOCAST if self.autocast else FP32


MODES = {m.name: m for m in (
    PrecisionMode("fp32", "float32", "fp32", served_as="fp32", benched_on=("cuda", "cpu"), report=REFERENCE),
    PrecisionMode("tf32", "float32", "tf32", served_as="tf32", tf32=True),
    PrecisionMode("fp16", "float16", "fp16", served_as="fp16", autocast=True, loss_scaling=True, benched_on=("cuda",),
                  deepspeed={**DS_OFF, "fp16": {"enabled": True}}),  # DeepSpeed's own fp16 module (pure16)
    PrecisionMode("bf16", "bfloat16", "bf16", served_as="bf16", autocast=True, benched_on=("cuda", "cpu"),
                  deepspeed={**DS_OFF, "torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
                  deepspeed_why={"bf16.enabled": "runs as torch autocast with fp32 weights"}),
    PrecisionMode("bf16-pure", "bfloat16", "bf16", served_as="bf16", weights="bfloat16", deepspeed=None),
)}
"""Every mode a job runs in, by name, in the order the reference lists them."""

DEFAULT = "fp32"


def names() -> tuple[str, ...]:
    """The `precision` values: every mode, then auto."""
    return (*MODES, AUTO)


def listed() -> str:
    """The values as one line, the default marked: fp32 (default) | tf32 | ... | auto."""
    return " | ".join(f"{name} (default)" if name == DEFAULT else name for name in names())


def report_side(requested: str) -> str:
    """The side of the AMP table a run that asked for `requested` lands on; "" for none."""
    found = MODES.get(requested)
    return found.report if found else AMP if requested == AUTO else ""


def sixteen_bit(requested: str) -> bool:
    """Whether a run that asked for `requested` computes in 16 bit, as AMP does (auto: whatever the
    device picks, which is its AMP); tf32 is fp32 arithmetic on TF32 matmuls, no AMP."""
    found = MODES.get(requested)
    return found.compute != "float32" if found else requested == AUTO
