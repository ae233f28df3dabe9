"""What a trained model costs to serve: parameters, size on disk, latency at batch 1 (p50, p95),
throughput at a serving batch and peak memory, per precision and sequence length.

The clock sees only forward passes: the inputs are token-id tensors made on the device before it
starts (no tokenization, no data loading), warm-up passes are run and left out, and on CUDA every
timed stretch ends with torch.cuda.synchronize, so queued kernels are counted. A 16-bit precision
runs the model cast to that dtype (weights and activations, as it would be served), not autocast.
Token values do not change an encoder's work, only the shape does: the ids are drawn at random
from the vocabulary (seeded), the attention mask is all ones (a batch of one length).

Models compared are measured side by side (bench_side_by_side): all loaded first, then timed in
turns, repetition by repetition, in rotating order, so a machine shared with other work slows each
of them alike instead of whichever ran while it was busy; `infer-bench` and the study report's
payoff use it, and a stage's own figure is the same measurement of one model (bench).

Peak memory says what it is, taken at warm-up (before the timed turns): on CUDA `peak_mem_mb` is
the allocator's peak while the model ran,
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
from pipeline.config.precision_modes import MODES
from pipeline.measure.telemetry import synchronize
from pipeline.runtime.precision import refusal

LATENCY_REPS = (10, 100)
"""Batch-1 passes per measurement: at least, at most (the budget decides in between); over several
repetitions, shared out between them (per_turn)."""
THROUGHPUT_REPS = (3, 30)
"""Serving-batch passes per measurement: at least, at most."""


def per_turn(bounds: tuple[int, int], reps: int, floor: int) -> tuple[int, int]:
    """A measurement's pass bounds shared out over `reps` turns (at least `floor` passes a turn), so
    taking turns costs about what one measurement costs."""
    return max(floor, -(-bounds[0] // reps)), max(floor, bounds[1] // reps)


@dataclass
class Measurement:
    precision: str
    length_name: str
    length: int
    latency_ms_p50: float
    """The median over repetitions of each repetition's batch-1 p50."""
    latency_ms_p95: float
    """Over every batch-1 pass of every repetition."""
    samples_per_s: float
    """The median over repetitions."""
    peak_mem_mb: float | None
    """Weights and activations (CUDA allocator) or the resident-set growth (CPU); None where unknown."""
    latency_reps: int
    throughput_reps: int
    latency_ms_p50_by_rep: list[float] = field(default_factory=list)
    """Each repetition's p50, in repetition order (one entry for a single repetition)."""
    samples_per_s_by_rep: list[float] = field(default_factory=list)


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
    reps: int = 1
    """Repetitions: models measured side by side take one turn each per repetition (bench_side_by_side)."""

    def figures(self) -> dict[str, float]:
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


@dataclass(frozen=True)
class Served:
    """A model to measure: how to load it in a dtype on a device, and what its inputs are."""

    load: Callable[[torch.dtype, torch.device], torch.nn.Module]
    vocab_size: int
    input_names: list[str]
    size_mb: float
    precisions: tuple[str, ...] | None = None
    """The precisions it runs in (an exported graph: the one it was exported in, named fp32); None: any."""


def inference_precisions(stage_precision: str, device: torch.device) -> list[str]:
    """The precision the stage's model is served in first (its mode's served_as: bf16-pure serves
    as bf16), then the others this device runs inference in: each mode benched on this device type
    that the device runs (runtime/precision.refusal), in the registry's order: fp32 everywhere; on
    CUDA fp16, and bf16 where native; on a CPU bf16 where training would run it (native, or
    emulated where allowed), never fp16 (slower there)."""
    others = [m.served_as for m in MODES.values() if device.type in m.benched_on and not refusal(m, device)]
    return list(dict.fromkeys([MODES[stage_precision].served_as, *others]))


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


def bench(model: Served, device: torch.device, *, lengths: dict[str, int], precisions: list[str],
          batch_size: int, budget_s: float) -> BenchResult:
    """Measure the model `model.load(dtype, device)` builds (in eval mode), once per precision, at
    each named length (`{"median": 37, "longest": 64}`; equal lengths are measured once): the
    side-by-side measurement of one model in one repetition."""
    return bench_side_by_side({"model": model}, device, lengths=lengths, precisions=precisions,
                              batch_size=batch_size, budget_s=budget_s, reps=1)["model"]


def turn_order(names_: list[str], rep: int) -> list[str]:
    """Who goes when in repetition `rep`: the models in turn, the first one rotated each repetition
    (A B C, B C A, C A B), so no model always runs first or right after a given other."""
    k = rep % len(names_)
    return names_[k:] + names_[:k]


def bench_side_by_side(models: dict[str, Served], device: torch.device, *, lengths: dict[str, int],
                       precisions: list[str], batch_size: int, budget_s: float, reps: int) -> dict[str, BenchResult]:
    """Measure several models on one device, taking turns: per precision every model is loaded
    (and warmed up, its peak memory taken) first, then in each of `reps` repetitions every model is
    timed once at each length, in turn_order. Whatever else the machine does meanwhile lands on
    every model alike, and each figure is the median over repetitions with each repetition's value
    kept (`*_by_rep`, for its spread and for ratios of turns taken close together). `batch_size`
    is the serving batch of the throughput figure; `budget_s` each model's share of timed seconds,
    over every precision and length (the minimum passes may exceed it)."""
    distinct = sorted(set(lengths.values()))
    share = budget_s / max(1, len(precisions) * len(distinct) * reps)
    results: dict[str, BenchResult] = {}
    for precision in precisions:
        loaded: dict[str, tuple[torch.nn.Module, dict, dict]] = {}
        for name, served in models.items():
            if served.precisions is not None and precision not in served.precisions:
                continue
            before = _memory_now(device)
            model = served.load(getattr(torch, MODES[precision].compute), device).eval()
            if name not in results:
                total, no_embed = count_params(model)
                results[name] = BenchResult(total, no_embed, served.size_mb, str(device), torch.get_num_threads(),
                                            batch_size, dict(lengths), reps=reps)
            inputs = {n: (_inputs(served.vocab_size, served.input_names, 1, n, device),
                          _inputs(served.vocab_size, served.input_names, batch_size, n, device))
                      for n in distinct}
            peaks = {n: _warm_up(model, device, *inputs[n], before) for n in distinct}
            loaded[name] = (model, inputs, peaks)
        timed: dict[tuple[str, int], list[tuple[list[float], float, int]]] = {}
        matmul = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = MODES[precision].tf32
        latency_bounds, throughput_bounds = per_turn(LATENCY_REPS, reps, 3), per_turn(THROUGHPUT_REPS, reps, 1)
        try:
            for rep in range(reps):
                for name in turn_order(list(loaded), rep):
                    model, inputs, _ = loaded[name]
                    for n in distinct:
                        one, many = inputs[n]
                        latencies = _time_latency(model, device, one, share / 2, latency_bounds)
                        samples_per_s, passes = _time_throughput(model, device, many, share / 2, throughput_bounds)
                        timed.setdefault((name, n), []).append((latencies, samples_per_s, passes))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
        for name, (_, _, peaks) in loaded.items():
            by_length = {n: _summary(timed[(name, n)], peaks[n]) for n in distinct}
            for length_name, length in lengths.items():
                results[name].measurements.append(Measurement(precision, length_name, length, **by_length[length]))
        loaded = model = None  # freed here (no cycles): the next precision's memory baseline starts without them
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _summary(turns: list[tuple[list[float], float, int]], peak: float | None) -> dict:
    """One model's figures at one length from its turns: medians over repetitions, p95 over every pass."""
    p50s = [float(np.percentile(np.array(lat) * 1000, 50)) for lat, _, _ in turns]
    every = np.concatenate([np.array(lat) * 1000 for lat, _, _ in turns])
    rates = [sps for _, sps, _ in turns]
    return {"latency_ms_p50": float(np.median(p50s)), "latency_ms_p95": float(np.percentile(every, 95)),
            "samples_per_s": float(np.median(rates)), "peak_mem_mb": peak, "latency_reps": len(every),
            "throughput_reps": sum(passes for _, _, passes in turns), "latency_ms_p50_by_rep": p50s,
            "samples_per_s_by_rep": rates}


def _inputs(vocab_size: int, input_names: list[str], batch: int, length: int, device: torch.device) -> dict:
    ids = torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return {k: v.to(device) for k, v in inputs.items() if k in input_names}


@torch.inference_mode()
def _warm_up(model: torch.nn.Module, device: torch.device, one: dict, many: dict, before: float) -> float | None:
    """Kernels chosen, buffers allocated, caches filled (left out of every clock); returns the peak
    memory of the model at this length since `before` (None where the system cannot say)."""
    resettable = _reset_peak(device)
    for inputs in (one, one, many):
        model(**inputs)
    synchronize(device)
    return _peak_since(device, before) if resettable else None


@torch.inference_mode()
def _time_latency(model: torch.nn.Module, device: torch.device, one: dict, budget: float,
                  bounds: tuple[int, int] = LATENCY_REPS) -> list[float]:
    """Seconds of each batch-1 pass: bounds[0] at least, then until `budget` or bounds[1]."""
    latencies = []
    t_end = time.perf_counter() + budget
    while len(latencies) < bounds[1] and (len(latencies) < bounds[0] or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        model(**one)
        synchronize(device)  # a request's answer is on the host only once its kernels ran
        latencies.append(time.perf_counter() - t0)
    return latencies


@torch.inference_mode()
def _time_throughput(model: torch.nn.Module, device: torch.device, many: dict, budget: float,
                     bounds: tuple[int, int] = THROUGHPUT_REPS) -> tuple[float, int]:
    """(samples/s, passes) at the serving batch: bounds[0] passes at least, then until `budget` or
    bounds[1]; one synchronization at the end, as a server streams batches."""
    reps = 0
    t_end = time.perf_counter() + budget
    t0 = time.perf_counter()
    while reps < bounds[1] and (reps < bounds[0] or time.perf_counter() < t_end):
        model(**many)
        reps += 1
    synchronize(device)
    return reps * len(next(iter(many.values()))) / (time.perf_counter() - t0), reps


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
           "sps_min", "sps_max", "speedup", "speedup_min", "speedup_max", "peak_mb")


def rows(results: dict[str, BenchResult]) -> list[dict]:
    """One row per (model, precision, length): medians over repetitions with their range (min,
    max); `speedup` is the median over repetitions of the throughput against the first model's
    turn in the same repetition, precision and length (1.0 for the first), with its range."""
    first = next(iter(results.values()))
    base = {(m.precision, m.length): m.samples_per_s_by_rep for m in first.measurements}
    out = []
    for model, r in results.items():
        for m in r.measurements:
            ref = base.get((m.precision, m.length))
            ratios = [a / b for a, b in zip(m.samples_per_s_by_rep, ref)] if ref else []
            out.append({"model": model, "precision": m.precision, "length": m.length, "params": r.params,
                        "no_embed": r.params_no_embed, "size_mb": r.size_mb, "p50_ms": m.latency_ms_p50,
                        "p95_ms": m.latency_ms_p95, "samples_per_s": m.samples_per_s,
                        "sps_min": min(m.samples_per_s_by_rep), "sps_max": max(m.samples_per_s_by_rep),
                        "speedup": float(np.median(ratios)) if ratios else None,
                        "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None,
                        "peak_mb": m.peak_mem_mb, "reps": r.reps})
    return out


def table(results: dict[str, BenchResult]) -> str:
    """The rows as a plain-text table, with the machine it ran on above it."""
    first = next(iter(results.values()))
    memory = "CUDA allocator peak" if first.device.startswith("cuda") else "resident-set growth"
    head = (f"device {first.device}, {first.threads} threads; {first.reps} repetitions, the models taking turns "
            f"(order rotated each repetition): medians, and min/max over the repetitions; latency at batch 1, "
            f"throughput at batch {first.batch_size}; peak_mb: {memory}; speedup: throughput against the first "
            "model's turn in the same repetition\n")

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    def shown(r: dict, c: str) -> str:
        return cell(r[c]) + ("x" if c.startswith("speedup") and r[c] is not None else "")

    body = [[shown(r, c) for c in COLUMNS] for r in rows(results)]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in [list(COLUMNS), *body]]
    return head + "\n".join(lines) + "\n"
