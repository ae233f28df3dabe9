"""Where a GPU training step's kernel time goes, and how far each part is from its floor.

`profile_table` takes torch.profiler's trace events (the Chrome-trace dicts that
`profile.export_chrome_trace` writes) and keeps device kernels only (`cat == "kernel"`): no
annotation range (`ProfilerStep#N`, `Optimizer.step#AdamW.step`, which span kernels already
counted), no CPU op, no memcpy or memset. Each kernel falls in exactly one class by its name
(`kernel_class`); busy time is the union of the kernels' intervals, so overlapping kernels (two
streams) count once and the busy share of the window is at most 1.

`step_floors` gives each class the least time it can take: the FLOPs it must do at the tensor
cores' peak (matmul, attention) or the bytes it must move at the memory bandwidth (the rest, from
`StepShape`, the model's sizes and the batch); "other" has no floor. `count_flops_by_kind` splits a
step's counted FLOPs into those two floors' kinds. bench_gpu.py's instruments, not the trainer's.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeline.runtime.precision import PrecisionPolicy

PEAK_BANDWIDTH_TBS: dict[str, float] = {
    # Memory bandwidth in TB/s from the vendors' data sheets (NVIDIA H100 Tensor Core GPU data sheet:
    # SXM 3.35, PCIe 2.0, NVL 3.9; NVIDIA H200 Tensor Core GPU data sheet: SXM and NVL 4.8; NVIDIA A100
    # data sheet: 40GB 1.555, 80GB PCIe 1.935, 80GB SXM 2.039). The floor of a memory-bound kernel.
    "H100 80GB HBM3": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8, "H200 NVL": 4.8,
    "A100": 1.555, "A100 80GB PCIe": 1.935, "A100-SXM4-80GB": 2.039,
}


def peak_bandwidth_tbs(device_name: str) -> float | None:
    """The data sheet's memory bandwidth (TB/s) of the most specific entry in the device's name, as
    telemetry.peak_tflops picks; None for a device not listed. A MIG slice gets the whole GPU's figure."""
    found = [model for model in PEAK_BANDWIDTH_TBS if model in device_name]
    return PEAK_BANDWIDTH_TBS[max(found, key=len)] if found else None


CLASSES = ("matmul", "attention", "optimizer", "norm+dropout+residual", "activation", "casts", "other")

# Kernels inductor generates are named after the aten ops fused into them (triton_{poi,per,red}_fused_
# OPS_N, templates triton_tem_fused_OPS_N), so a fused kernel is classed by the ops it holds, in this
# order: a layer norm fused with its residual add and a cast is normalization, GELU fused with its
# bias add is the activation, an unfused bias add (addmm's epilogue) is the matmul's.
_TRITON_TEMPLATE = re.compile(r"^triton_(?:tem|mm)")  # GEMM templates, epilogues fused in: matmul time
_TRITON_RULES = (  # on the fused ops' part of the name
    ("optimizer", r"adam|_foreach"),
    ("attention", r"attention"),
    ("norm+dropout+residual", r"layer_norm|dropout"),
    ("activation", r"gelu|tanh|(?:^|_)erf|relu|silu"),
    ("norm+dropout+residual", r"(?:^|_)add(?:_|$)"),
    ("matmul", r"(?:^|_)(?:addmm|mm|bmm)(?:_|$)"),
    ("casts", r"to_copy|convert_element_type"),
)
# Library kernels (aten, cuBLAS, cuDNN, CUTLASS), lower-cased names; attention before matmul: cuDNN's
# attention kernels name the GEMM instructions they use.
_LIBRARY_RULES = (
    ("optimizer", r"multi_tensor_apply|fusedoptimizer|fused_adam|adam"),
    ("attention", r"flash|fmha|sdpa|attention|attn"),
    ("matmul", r"gemm|cutlass|cublas|xmma|nvjet|^sm\d+_|ampere_|hopper_|splitkreduce"),
    ("norm+dropout+residual", r"layer_norm|layernorm|gammabeta|dropout|masked_scale|functor_add|functoronself_add"),
    ("activation", r"gelu|tanh|(?<![a-z])erf|relu|silu"),
    ("casts", r"copy_kernel|to_copy|convert"),
)


def kernel_class(name: str) -> str:
    """The one class (of CLASSES) of a device kernel, from its name; "other" when no rule matches."""
    lower = name.lower()
    if _TRITON_TEMPLATE.search(lower):
        return "matmul"
    if lower.startswith("triton_"):
        text, rules = lower.split("fused_", 1)[-1], _TRITON_RULES
    else:
        text, rules = lower, _LIBRARY_RULES
    return next((cls for cls, pattern in rules if re.search(pattern, text)), "other")


def kernel_events(trace_events: list[dict]) -> list[dict]:
    """The device kernels among a Chrome trace's events (complete events of category "kernel")."""
    return [e for e in trace_events if e.get("cat") == "kernel" and e.get("ph", "X") == "X" and e.get("dur", 0) > 0]


def busy_us(kernels: list[dict]) -> float:
    """Microseconds in which at least one kernel ran: the union of their [ts, ts + dur) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def profile_table(trace_events: list[dict], steps: int) -> dict:
    """Per step, from a trace of `steps` steps: the window (first kernel's start to last kernel's
    end), the busy time (union of kernel intervals), busy share and idle time; each class's kernel ms
    and launches; and every kernel name's ms, launches and class. Classes are summed per kernel, so
    with overlapping kernels they add up to more than the busy time; no kernel counts twice."""
    kernels = kernel_events(trace_events)
    window = (max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)) if kernels else 0.0
    busy = busy_us(kernels)
    by_name: dict[str, list[float]] = {}
    for k in kernels:
        entry = by_name.setdefault(k["name"], [0.0, 0])
        entry[0] += k["dur"]
        entry[1] += 1
    names = {name: {"ms": us / 1000 / steps, "launches": count / steps}
             for name, (us, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])}
    return {"window_ms": window / 1000 / steps, "busy_ms": busy / 1000 / steps,
            "busy_share": busy / window if window else None, "idle_ms": (window - busy) / 1000 / steps,
            **classify(names)}


def classify(names: dict[str, dict]) -> dict:
    """{"classes": ms and launches by class, "kernels": each name's figures with its class} from
    {kernel name: {"ms", "launches"}}: also re-classes a stored profile by the current rules."""
    classes = {cls: {"ms": 0.0, "launches": 0.0} for cls in CLASSES}
    out = {}
    for name, figures in names.items():
        cls = kernel_class(name)
        classes[cls]["ms"] += figures["ms"]
        classes[cls]["launches"] += figures["launches"]
        out[name] = {**figures, "class": cls}
    return {"classes": classes, "kernels": out}


@dataclass(frozen=True)
class StepShape:
    """What one training step of a BERT-style encoder must compute and move."""

    tokens: int
    """Rows x padded length: the positions every layer computes."""
    hidden: int
    intermediate: int
    layers: int
    parameters: int
    """Every trainable parameter: what the optimizer steps."""
    linear_parameters: int
    """Weights and biases of the Linear layers: what autocast casts to the compute dtype each step."""
    activation_bytes: int
    """Bytes of one activation element in the compute dtype: 2 for bf16/fp16, 4 for fp32."""
    low_precision_weights: bool = False
    """The module holds its weights in the compute dtype, fp32 masters in the optimizer (bf16-pure)."""
    dropout: bool = True
    clip: bool = True

    @classmethod
    def of(cls, model: torch.nn.Module, rows: int, length: int, policy: PrecisionPolicy, clip: bool = True):
        """The shape of a training step of a transformers encoder (`model.config`'s sizes) on rows x
        length tokens under `policy`, counted before the policy casts the module."""
        config = model.config
        low = policy.compute_dtype in (torch.bfloat16, torch.float16)
        linear = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())
        return cls(tokens=rows * length, hidden=config.hidden_size, intermediate=config.intermediate_size,
                   layers=config.num_hidden_layers,
                   parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
                   linear_parameters=linear, activation_bytes=2 if low else 4,
                   low_precision_weights=policy.module_dtype != torch.float32,
                   dropout=config.hidden_dropout_prob > 0, clip=clip)


ADAMW_STATE_BYTES = 24
"""Fused AdamW over fp32 masters reads and writes the weight and both moments, 4 bytes each."""


def step_bytes(shape: StepShape) -> dict[str, float]:
    """Bytes each memory-bound class must move in one step, forward and backward, every tensor read
    or written once per pass at the compute dtype's width (the fusion the class could reach):

    - optimizer: AdamW's 24 bytes a parameter on fp32 masters, plus reading the gradient (4 bytes,
      or 2 when the module's weights and so its gradients are bf16, which then also writes the
      module's bf16 copy, 2 bytes), plus one more read of the gradient for the clipping norm: 32 bytes a
      parameter under autocast, 30 under bf16 compute weights;
    - norm+dropout+residual, at each of the 2 per layer + 1 (embeddings) layer norms, per hidden
      element: forward reads the branch and the residual and writes the output (3), backward reads
      the output's gradient and the saved output and writes the branch's and the residual's
      gradients (4), at the compute width; the dropout mask, 1 byte, written and read once (2);
    - activation (GELU, per intermediate element of each layer): forward reads and writes (2),
      backward reads the gradient and the saved input and writes (3);
    - casts: under autocast, each Linear weight read in fp32 and written in the compute dtype once a
      step (the backward uses the forward's copies); nothing otherwise (activations stay in the
      compute dtype in the floor)."""
    a = shape.activation_bytes
    grad_bytes = 2 if shape.low_precision_weights else 4
    optimizer = shape.parameters * (ADAMW_STATE_BYTES + grad_bytes + (2 if shape.low_precision_weights else 0)
                                    + (grad_bytes if shape.clip else 0))
    sites = 2 * shape.layers + 1
    norm = sites * shape.tokens * shape.hidden * (7 * a + (2 if shape.dropout else 0))
    activation = shape.layers * shape.tokens * shape.intermediate * 5 * a
    autocast_weights = a < 4 and not shape.low_precision_weights
    casts = shape.linear_parameters * (4 + a) if autocast_weights else 0
    return {"optimizer": float(optimizer), "norm+dropout+residual": float(norm), "activation": float(activation),
            "casts": float(casts)}


def step_floors(flops: dict[str, float], shape: StepShape, peak_tflops: float | None,
                bandwidth_tbs: float | None) -> dict[str, float | None]:
    """Each class's floor in ms a step: `flops` ({"matmul", "attention"}, as
    flops.count_flops_by_kind counts them) at `peak_tflops`, step_bytes at `bandwidth_tbs`; None
    where the device's figure is unknown, and for "other"."""
    floors: dict[str, float | None] = dict.fromkeys(CLASSES)
    for cls in ("matmul", "attention"):
        floors[cls] = flops.get(cls, 0.0) / (peak_tflops * 1e12) * 1e3 if peak_tflops else None
    for cls, nbytes in step_bytes(shape).items():
        floors[cls] = nbytes / (bandwidth_tbs * 1e12) * 1e3 if bandwidth_tbs else None
    return floors


def floor_rows(table: dict, floors: dict[str, float | None]) -> list[dict]:
    """One row per class: ms, launches a step, floor ms and ms / floor; then the busy total."""
    rows = []
    for cls in CLASSES:
        ms, floor = table["classes"][cls]["ms"], floors.get(cls)
        rows.append({"class": cls, "ms": ms, "launches": table["classes"][cls]["launches"], "floor ms": floor,
                     "ratio": ms / floor if floor else None})
    known = [f for f in floors.values() if f is not None]
    rows.append({"class": "busy (union)", "ms": table["busy_ms"], "launches": None,
                 "floor ms": sum(known) if known else None, "ratio": None})
    return rows


ANNOTATION = re.compile(r"^ProfilerStep#\d+$|^Optimizer\.\w+#")


def classify_totals(kernel_ms: dict[str, float]) -> dict[str, float]:
    """ms by class from {kernel name: ms} as an older results file lists its top kernels; names that
    are annotation ranges (ProfilerStep#N, Optimizer.step#...) are left out."""
    out = dict.fromkeys(CLASSES, 0.0)
    for name, ms in kernel_ms.items():
        if not ANNOTATION.search(name):
            out[kernel_class(name)] += ms
    return out


def count_flops_by_kind(step: Callable[[], object]) -> dict[str, float]:
    """FLOPs of `step()` as count_flops counts them, split into "attention" (the fused attention
    kernels' ops, forward and backward) and "matmul" (every other counted op: mm, addmm, bmm; an
    unfused attention's bmm count here, as it runs as matmuls)."""
    with FlopCounterMode(display=False) as counter:
        step()
    kinds = {"matmul": 0.0, "attention": 0.0}
    for op, flops in counter.get_flop_counts().get("Global", {}).items():
        kinds["attention" if "attention" in str(op) else "matmul"] += float(flops)
    return kinds
