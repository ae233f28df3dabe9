"""What a trained model costs to serve: parameters, size on disk, latency at batch 1 (p50, p95),
throughput at a serving batch and peak memory, per precision and sequence length.

The clock sees only forward passes: the inputs are token-id tensors made on the device before it
starts (no tokenization, no data loading), warm-up passes are run and left out, and on CUDA every
timed stretch ends with torch.cuda.synchronize, so queued kernels are counted. A 16-bit precision
runs the model cast to that dtype (weights and activations, as it would be served), not autocast.
Token values do not change an encoder's work, only the shape does: the ids are drawn at random
from the vocabulary (seeded), the attention mask is all ones (a batch of one length).

Peak memory says what it is: on CUDA `peak_mem_mb` is the allocator's peak while the model ran,
less what was allocated before it was loaded (its weights and activations); on CPU `peak_rss_mb`
is the process's resident-set high-water mark while the model ran (Linux VmHWM, reset through
/proc/self/clear_refs) less the resident set before it was loaded: memory the allocator reuses
from earlier work is not counted, so it can read low.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline import names
from pipeline.measure.telemetry import synchronize
from pipeline.runtime.precision import cpu_supports_bf16, cuda_supports_bf16

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LATENCY_REPS = (10, 100)
"""Batch-1 passes per measurement: at least, at most (the budget decides in between)."""
THROUGHPUT_REPS = (3, 30)
"""Serving-batch passes per measurement: at least, at most."""


@dataclass(frozen=True)
class BenchSettings:
    batch_size: int = 32
    """The serving batch of the throughput figure."""
    budget_s: float = 20.0
    """Seconds of timed passes, shared by every (precision, length); the minimum reps may exceed it."""


@dataclass
class Measurement:
    precision: str
    length_name: str
    length: int
    latency_ms_p50: float
    latency_ms_p95: float
    samples_per_s: float
    peak_mem_mb: float | None
    """Weights and activations (CUDA allocator) or the resident-set growth (CPU); None where unknown."""
    latency_reps: int
    throughput_reps: int


@dataclass
class BenchResult:
    params: int
    params_no_embed: int
    size_mb: float
    device: str
    threads: int
    batch_size: int
    lengths: dict[str, int]
    measurements: list[Measurement] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """The infer/* metrics (names.py spells them)."""
        out = {names.INFER_PARAMS: float(self.params), names.INFER_PARAMS_NO_EMBED: float(self.params_no_embed),
               names.INFER_SIZE_MB: self.size_mb, names.INFER_BATCH: float(self.batch_size),
               **{names.infer_length(k): float(v) for k, v in self.lengths.items()}}
        memory = names.INFER_PEAK_MEM if self.device.startswith("cuda") else names.INFER_PEAK_RSS
        for m in self.measurements:
            values = {names.INFER_LATENCY_P50: m.latency_ms_p50, names.INFER_LATENCY_P95: m.latency_ms_p95,
                      names.INFER_SAMPLES_PER_S: m.samples_per_s, memory: m.peak_mem_mb}
            out.update({names.infer_metric(k, m.precision, m.length_name): v for k, v in values.items()
                        if v is not None})
        return out


def inference_precisions(stage_precision: str, device: torch.device) -> list[str]:
    """The stage's precision first, then the others this device runs inference in: fp32
    everywhere; on CUDA fp16, and bf16 where native (the pipeline's rule); on a CPU bf16 only
    where oneDNN has bf16 kernels (it refuses bf16 on AVX2-only CPUs), never fp16 (slower there)."""
    others = ["fp32"]
    if device.type == "cuda":
        others += ["fp16"] + (["bf16"] if cuda_supports_bf16() else [])
    elif cpu_supports_bf16():
        others.append("bf16")
    return list(dict.fromkeys([stage_precision, *others]))


@contextlib.contextmanager
def serving_threads(device: torch.device) -> Iterator[int]:
    """On a CPU, torch's threads set to every core this process may run on, for the length of the
    block: a served model owns its machine, whatever threads the training launch gave the process
    (torchrun gives each of N processes one), so stages launched differently are measured alike.
    Yields the thread count (a GPU's figures do not depend on it: unchanged)."""
    before = torch.get_num_threads()
    wanted = len(os.sched_getaffinity(0)) if device.type == "cpu" else before
    torch.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        torch.set_num_threads(before)


def typical_lengths(lengths: list[int], multiple: int, max_length: int) -> dict[str, int]:
    """A split's typical lengths: its median (a request of one row is not padded) and its longest
    bucket (the longest row padded to `multiple`, as a serving batch of it would be, up to max_length)."""
    longest = min(max_length, -(-max(lengths) // multiple) * multiple)
    return {"median": int(np.median(lengths)), "longest": longest}


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(all parameters, those outside the embedding tables): transformers' num_parameters, which
    leaves out every nn.Embedding (word, position, token type)."""
    return model.num_parameters(), model.num_parameters(exclude_embeddings=True)


def bench(load: Callable[[torch.dtype, torch.device], torch.nn.Module], device: torch.device, *,
          vocab_size: int, input_names: list[str], lengths: dict[str, int], precisions: list[str],
          size_mb: float, settings: BenchSettings) -> BenchResult:
    """Measure the model `load(dtype, device)` builds (in eval mode), once per precision, at each
    named length (`{"median": 37, "longest": 64}`; equal lengths are measured once)."""
    distinct = sorted(set(lengths.values()))
    share = settings.budget_s / max(1, len(precisions) * len(distinct))
    result = None
    for precision in precisions:
        before = _memory_now(device)
        model = load(DTYPES[precision], device).eval()
        if result is None:
            total, no_embed = count_params(model)
            result = BenchResult(total, no_embed, size_mb, str(device), torch.get_num_threads(),
                                 settings.batch_size, dict(lengths))
        matmul = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        try:
            by_length = {n: _measure(model, device, vocab_size, input_names, n, settings.batch_size, share, before)
                         for n in distinct}
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
        for name, length in lengths.items():
            result.measurements.append(Measurement(precision, name, length, *by_length[length]))
        del model  # freed here (no cycles): the next precision's memory baseline starts without it
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def _inputs(vocab_size: int, input_names: list[str], batch: int, length: int, device: torch.device) -> dict:
    ids = torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return {k: v.to(device) for k, v in inputs.items() if k in input_names}


@torch.inference_mode()
def _measure(model: torch.nn.Module, device: torch.device, vocab_size: int, input_names: list[str], length: int,
             batch: int, budget: float, before: float) -> tuple:
    one = _inputs(vocab_size, input_names, 1, length, device)
    many = _inputs(vocab_size, input_names, batch, length, device)
    resettable = _reset_peak(device)
    for inputs in (one, one, many):  # warm-up: kernels chosen, buffers allocated, caches filled
        model(**inputs)
    synchronize(device)
    latencies = []
    t_end = time.perf_counter() + budget / 2
    while len(latencies) < LATENCY_REPS[1] and (len(latencies) < LATENCY_REPS[0] or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        model(**one)
        synchronize(device)  # a request's answer is on the host only once its kernels ran
        latencies.append(time.perf_counter() - t0)
    reps = 0
    t_end = time.perf_counter() + budget / 2
    t0 = time.perf_counter()
    while reps < THROUGHPUT_REPS[1] and (reps < THROUGHPUT_REPS[0] or time.perf_counter() < t_end):
        model(**many)
        reps += 1
    synchronize(device)
    elapsed = time.perf_counter() - t0
    p50, p95 = np.percentile(np.array(latencies) * 1000, [50, 95])
    peak = _peak_since(device, before) if resettable else None
    return float(p50), float(p95), reps * batch / elapsed, peak, len(latencies), reps


def _memory_now(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return _status_mb("VmRSS") or 0.0


def _reset_peak(device: torch.device) -> bool:
    """Start a new peak; False where this system cannot (the CPU figure is then left out)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:  # Linux >= 4.0: "5" resets VmHWM to the current resident set (proc(5), clear_refs)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_since(device: torch.device, before: float) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20 - before
    peak = _status_mb("VmHWM")
    return None if peak is None else max(0.0, peak - before)


def _status_mb(field_name: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


COLUMNS = ("model", "precision", "length", "params", "no_embed", "size_mb", "p50_ms", "p95_ms", "samples_per_s",
           "speedup", "peak_mb")


def rows(results: dict[str, BenchResult]) -> list[dict]:
    """One row per (model, precision, length); `speedup` is the throughput against the first model's
    at the same precision and length (1.0 for the first)."""
    first = next(iter(results.values()))
    base = {(m.precision, m.length): m.samples_per_s for m in first.measurements}
    out = []
    for model, r in results.items():
        for m in r.measurements:
            ref = base.get((m.precision, m.length))
            out.append({"model": model, "precision": m.precision, "length": m.length, "params": r.params,
                        "no_embed": r.params_no_embed, "size_mb": r.size_mb, "p50_ms": m.latency_ms_p50,
                        "p95_ms": m.latency_ms_p95, "samples_per_s": m.samples_per_s,
                        "speedup": m.samples_per_s / ref if ref else None, "peak_mb": m.peak_mem_mb})
    return out


def table(results: dict[str, BenchResult]) -> str:
    """The rows as a plain-text table, with the machine it ran on above it."""
    first = next(iter(results.values()))
    memory = "CUDA allocator peak" if first.device.startswith("cuda") else "resident-set growth"
    head = (f"device {first.device}, {first.threads} threads; latency at batch 1, throughput at batch "
            f"{first.batch_size}; peak_mb: {memory}; speedup: throughput against the first model\n")

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    body = [[cell(r[c]) + ("x" if c == "speedup" and r[c] is not None else "") for c in COLUMNS] for r in rows(results)]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in [list(COLUMNS), *body]]
    return head + "\n".join(lines) + "\n"
