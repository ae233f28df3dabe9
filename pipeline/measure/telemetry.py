"""Measurements of a run: throughput over training steps only, peak memory, FLOPs, energy,
device facts; and StageMeters, the one object that turns them into the logged metrics.

Clocks are read only after the device is synchronized, so queued GPU work is not missed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import logging
import math
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline import names
from pipeline.measure.energy import EnergyMeter
from pipeline.measure.flops import FlopModel
from pipeline.measure.load import LoadSampler
from pipeline.runtime import collectives, compiler

log = logging.getLogger("pipeline")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: waits for all queued kernels


class ThroughputMeter:
    """Samples, non-padding tokens, padded tokens (every row as computed, filler rows included) and
    seconds of training steps (eval and saving excluded).

    The clock runs in segments: start() and stop() bracket each stretch of training, and
    `seconds` is their sum, so a pause for a mid-epoch checkpoint loses no training time.
    With `compiled`, the time torch.compile spent compiling inside a segment is left out of
    `seconds` and counted in `compile_seconds` (compilation runs on the host, in the first steps
    of each new shape, while the device waits)."""

    def __init__(self, device: torch.device, compiled: bool = False):
        self.device = device
        self.compiled = compiled
        self.samples = 0
        self.tokens = 0
        self.padded_tokens = 0
        self.seconds = 0.0
        self.compile_seconds = 0.0
        self._t0: float | None = None
        self._compile_t0 = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()
        if self.compiled:
            self._compile_t0 = compiler.compile_seconds()

    def stop(self) -> float:
        """Ends the running segment (if any); returns the seconds of all segments so far."""
        if self._t0 is not None:
            synchronize(self.device)
            elapsed = time.perf_counter() - self._t0
            compiling = compiler.compile_seconds() - self._compile_t0 if self.compiled else 0.0
            self.seconds += elapsed - compiling
            self.compile_seconds += compiling
            self._t0 = None
        return self.seconds

    def running_seconds(self) -> float:
        """The seconds of all segments so far, the running one included up to now, without a device
        sync (right after one, as at a logged step whose loss was read, the figure is exact)."""
        if self._t0 is None:
            return self.seconds
        compiling = compiler.compile_seconds() - self._compile_t0 if self.compiled else 0.0
        return self.seconds + time.perf_counter() - self._t0 - compiling

    def add(self, samples: int, tokens: int, padded_tokens: int) -> None:
        """padded_tokens: the batch's rows x padded length (filler rows included)."""
        self.samples += samples
        self.tokens += tokens
        self.padded_tokens += padded_tokens


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak memory in MB under the name that says what it is (CUDA allocator or process RSS)."""
    if device.type == "cuda":
        return {names.PEAK_MEM_ALLOCATED: torch.cuda.max_memory_allocated(device) / 2**20,
                names.PEAK_MEM_RESERVED: torch.cuda.max_memory_reserved(device) / 2**20}
    # ru_maxrss is KiB on Linux; it is the peak since process start (it cannot be reset)
    return {names.PEAK_RSS: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpuinfo("model name") or platform.processor() or "cpu"


CPU_BF16_FLAGS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))
"""/proc/cpuinfo flag -> the bf16 hardware it names, the faster first."""


def cpu_bf16() -> str:
    """This CPU's bf16 matmul hardware: AMX, AVX512-BF16, or none (bf16 is then emulated, slower than fp32)."""
    flags = _cpuinfo("flags").split()
    return next((name for flag, name in CPU_BF16_FLAGS if flag in flags), "none")


def _cpuinfo(field: str) -> str:
    """The first value of a /proc/cpuinfo field ("" where there is none: not Linux, or no such field)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(field)), "")


def environment_tags() -> dict[str, str]:
    tags = {"torch_version": torch.__version__, "python_version": sys.version.split()[0]}
    for package in ("transformers", "deepspeed", "datasets", "mlflow"):
        try:  # metadata, not import: importing deepspeed costs seconds
            tags[f"{package}_version"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent)
        if commit.returncode == 0:
            tags[names.TAG_GIT_COMMIT] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return tags


# ---------------------------------------------------------------------- compute

# Dense peak TFLOP/s from the vendors' data sheets, per precision mode. A device that is not
# listed gets no MFU: a guessed peak would make the figure meaningless.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM5
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},  # data sheet's sparse / 2
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},  # lower clocks and power than SXM
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
}


FULL_SMS: dict[str, int] = {"H100 80GB HBM3": 132, "H100 PCIe": 114, "H100 NVL": 132, "H200": 132, "H200 NVL": 132,
                            "A100": 108}
"""Streaming multiprocessors of the whole GPU behind each PEAK_TFLOPS entry (the vendors' data sheets)."""


def peak_tflops(device_name: str, precision_name: str, sm_count: int | None = None) -> float | None:
    """The peak of the most specific table entry in the device's name ("H200 NVL" before "H200").
    A MIG slice keeps the whole GPU's name (CUDA adds " MIG 1g.10gb" after it, or nothing) but
    computes on its share of the SMs, which CUDA reports as the device's multi_processor_count
    (`sm_count`): its peak is the whole GPU's times that share, so its MFU is not several times too low."""
    found = [model for model in PEAK_TFLOPS if model in device_name]
    if not found:
        return None
    model = max(found, key=len)
    peak = PEAK_TFLOPS[model].get(precision_name)
    if peak is not None and sm_count and sm_count < FULL_SMS[model]:
        peak *= sm_count / FULL_SMS[model]
    return peak


# ---------------------------------------------------------------------- the stage's metrics


@dataclass
class MeterTotals:
    """The job's running totals, over every epoch so far (a resumed job reports the whole job)."""

    samples: float = 0.0
    tokens: float = 0.0
    """Real (non-padding) tokens."""
    padded_tokens: float = 0.0
    """Tokens as computed: every row of every batch at its padded length."""
    flops: float = 0.0
    """Of the real tokens trained (each row at its own length), summed over ranks (flops.FlopModel)."""
    padded_flops: float = 0.0
    """Of the micro-batches as computed (padding and filler rows included), summed over ranks."""
    train_seconds: float = 0.0
    compile_seconds: float = 0.0
    """Inside training, left out of train_seconds."""
    joules: float = 0.0
    epoch_times: list[float] = field(default_factory=list)
    peak: dict[str, float] = field(default_factory=dict)


class StageMeters:
    """The meters of one stage and the metrics they become (as torchtitan's metrics processor):
    throughput and energy over training steps only, peak memory, FLOPs and MFU, each reduced
    over ranks (sums of work, the slowest rank's time, the largest peak). Owns the job's totals
    (`totals`) and saves and restores them with the checkpoint."""

    def __init__(self, device: torch.device, precision_name: str, world_size: int, compiled: bool = False,
                 flop_model: FlopModel | None = None):
        self.device, self.world_size, self.compiled = device, world_size, compiled
        self.warned_compiles = False
        self.energy = EnergyMeter(device, compiled)
        props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
        self.peak_tflops = peak_tflops(device_name(device), precision_name,
                                       props.multi_processor_count) if props else None
        self.gpu_key = _uuid_key(str(props.uuid)) if props else 0.0
        """This rank's GPU, as a number (its UUID's digest; NVML not needed)."""
        self.gpus = world_size
        """The GPUs the job's ranks use, each counted once (ranks sharing one, PIPELINE_SHARE_GPU=1, count
        it once): MFU's peak. Counted by each epoch's collective; until then one per rank."""
        self.flop_model = flop_model
        """Counted by the loop outside the timed steps (Stage.step_flop_model); None: no FLOP metrics."""
        self.flops = 0.0
        """FLOPs of this epoch's timed real tokens on this rank."""
        self.padded_flops = 0.0
        """FLOPs of this epoch's timed micro-batches as computed on this rank."""
        self.throughput = ThroughputMeter(device, compiled)
        self.totals = MeterTotals()
        self.load = LoadSampler(device)
        """The machine's load from other work over the same segments (this process's figures)."""

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.totals)

    def load_state_dict(self, state: dict) -> None:
        self.totals = MeterTotals(**state)

    def energy_available_anywhere(self) -> bool:
        """Collective: does any rank measure energy (the run's energy_available tag)?"""
        (available,) = collectives.all_reduce([float(self.energy.available)], op="max")
        return bool(available)

    # -------------------------------------------------------------- an epoch
    def start_epoch(self) -> None:
        reset_peak_memory(self.device)
        self.throughput = ThroughputMeter(self.device, self.compiled)
        self.flops = self.padded_flops = 0.0
        self.throughput.start()
        self.energy.start()
        self.load.start()

    def pause(self) -> None:
        """A checkpoint save: neither training time nor training energy (both meters stop)."""
        self.throughput.stop()
        self.energy.pause()
        self.load.pause()

    def resume(self) -> None:
        self.throughput.start()
        self.energy.resume()
        self.load.resume()

    def add_batch(self, lengths: list[int], rows: int, padded_length: int) -> None:
        """A timed micro-batch: the real lengths of its data rows, and its shape as computed (rows,
        filler rows included, and padded length). Host numbers: no sync."""
        self.throughput.add(len(lengths), sum(lengths), rows * padded_length)
        if self.flop_model is not None:
            self.flops += self.flop_model.rows(lengths)
            self.padded_flops += self.flop_model.batch(rows, padded_length)

    def epoch_local(self) -> collectives.Figures:
        """Ends the epoch's clocks (every training segment; evaluation comes after) and gives this
        rank's numbers for the epoch's collective (epoch_figures takes them back reduced): work
        summed, time and peak memory the largest, each GPU's energy per rank (counted once by UUID)."""
        elapsed = self.throughput.stop()
        joules = self.energy.stop()
        self._load = self.load.stop()
        meter, energy, mem = self.throughput, self.energy, peak_memory(self.device)
        return collectives.Figures(
            sums={"samples": meter.samples, "tokens": meter.tokens, "padded_tokens": meter.padded_tokens,
                  "flops": self.flops, "padded_flops": self.padded_flops},
            maxes={"elapsed": elapsed, "compiling": meter.compile_seconds, **mem},
            per_rank=[{"energy_available": float(energy.available), "uuid": _uuid_key(energy.uuid), "joules": joules,
                       "utilization": math.nan if energy.mean_utilization is None else energy.mean_utilization,
                       "gpu": self.gpu_key}])

    def end_epoch(self) -> dict:
        """Collective: the epoch's clocks stopped, its perf/ and energy/ metrics over every rank (the
        loop reduces epoch_local() with the step losses' figures instead: one collective)."""
        return self.epoch_figures(collectives.reduce_local(self.epoch_local()))

    def epoch_figures(self, reduced: collectives.Figures) -> dict:
        """The epoch's perf/ and energy/ metrics from epoch_local()'s numbers over every rank; adds
        the epoch to the totals."""
        totals = self.totals
        samples, tokens, padded_tokens, flops, padded_flops = (
            reduced.sums[k] for k in ("samples", "tokens", "padded_tokens", "flops", "padded_flops"))
        mem = dict(reduced.maxes)
        elapsed, compiling = mem.pop("elapsed"), mem.pop("compiling")
        self.gpus = len({rank["gpu"] for rank in reduced.per_rank}) or self.world_size
        totals.compile_seconds += compiling
        totals.samples += samples
        totals.tokens += tokens
        totals.padded_tokens += padded_tokens
        totals.flops += flops
        totals.padded_flops += padded_flops
        totals.train_seconds += elapsed
        totals.epoch_times.append(elapsed)
        totals.peak = {k: max(v, totals.peak.get(k, 0.0)) for k, v in mem.items()}
        metrics = {names.EPOCH_TIME: elapsed, names.SAMPLES_PER_S: samples / elapsed,
                   names.TOKENS_PER_S: tokens / elapsed, names.PADDED_TOKENS_PER_S: padded_tokens / elapsed, **mem}
        metrics.update(self.compute_figures(flops, padded_flops, samples, elapsed))
        metrics.update(self.compile_figures(compiling))
        metrics.update(_energy_figures(reduced.per_rank, samples, elapsed))
        totals.joules += metrics.get(names.ENERGY_JOULES, 0.0)
        metrics.update(self._load.figures())
        return metrics

    # -------------------------------------------------------------- the job
    def final_figures(self, time_to_best: float | None) -> dict:
        """The whole job's perf/ and energy/ metrics, from the totals."""
        totals = self.totals
        metrics = {
            names.TRAIN_TIME: totals.train_seconds, names.TIME_TO_BEST: time_to_best,
            names.EPOCH_TIME: float(np.mean(totals.epoch_times)),
            names.SAMPLES_PER_S: totals.samples / totals.train_seconds,
            names.TOKENS_PER_S: totals.tokens / totals.train_seconds,
            names.PADDED_TOKENS_PER_S: totals.padded_tokens / totals.train_seconds, **totals.peak,
            **self.compute_figures(totals.flops, totals.padded_flops, totals.samples, totals.train_seconds),
            **self.compile_figures(totals.compile_seconds), **self.load.job_figures().figures(),
        }
        if totals.joules:
            metrics.update({names.ENERGY_JOULES: totals.joules, names.AVG_POWER: totals.joules / totals.train_seconds,
                            names.JOULES_PER_SAMPLE: totals.joules / totals.samples})
        return metrics

    def compile_figures(self, seconds: float) -> dict:
        """Compiled jobs: the seconds spent compiling inside training (left out of every rate) and
        the graphs this process has compiled so far."""
        if not self.compiled:
            return {}
        self.check_compiles()
        return {names.COMPILE_TIME: seconds, names.COMPILES: compiler.compiles()}

    def check_compiles(self) -> None:
        """One warning line, the first time this process has compiled more than compiler.WARN_COMPILES graphs."""
        count = compiler.compiles() if self.compiled and not self.warned_compiles else 0
        if count > compiler.WARN_COMPILES:
            self.warned_compiles = True
            log.warning("torch.compile has compiled %d graphs in this process (more than %d): batch shapes vary more "
                        "than train.pad_to_multiple_of buckets them (train.batch_tokens?); each new shape compiles "
                        "again", count, compiler.WARN_COMPILES)

    def compute_figures(self, flops: float, padded_flops: float, samples: float, seconds: float) -> dict:
        """Achieved TFLOP/s and, on a GPU in the peak table, MFU (FLOPs summed over ranks, against the peak
        of the GPUs used: ranks sharing one count it once): of the real tokens (the useful work), and
        beside them of the batches as padded and computed."""
        if not flops or not seconds:
            return {}
        tflops, padded_tflops = flops / seconds / 1e12, padded_flops / seconds / 1e12
        metrics = {names.FLOPS_PER_SAMPLE: flops / samples, names.TFLOPS: tflops, names.TFLOPS_PADDED: padded_tflops}
        if self.peak_tflops:
            peak = self.peak_tflops * self.gpus
            metrics.update({names.MFU: tflops / peak, names.MFU_PADDED: padded_tflops / peak})
        return metrics



def _uuid_key(uuid: str | None) -> float:
    """A GPU's UUID as a number a float64 holds exactly (48 bits of its digest): ranks sharing a
    GPU count its energy once."""
    if uuid is None:
        return 0.0
    return float(int.from_bytes(hashlib.sha256(uuid.encode()).digest()[:6], "big"))


def _energy_figures(readings: list[dict[str, float]], samples: float, seconds: float) -> dict:
    """Energy of the epoch summed over the job's GPUs (each counted once, by UUID): `readings`
    holds each rank's figures by name (energy_available, uuid, joules, utilization: NaN when unknown)."""
    per_gpu = {r["uuid"]: (r["joules"], r["utilization"]) for r in readings if r["energy_available"]}
    if not per_gpu:
        return {}
    joules = sum(j for j, _ in per_gpu.values())
    metrics = {names.ENERGY_JOULES: joules, names.AVG_POWER: joules / seconds,
               names.JOULES_PER_SAMPLE: joules / samples}
    utils = [u for _, u in per_gpu.values() if not math.isnan(u)]
    if utils:
        metrics[names.GPU_UTIL] = float(np.mean(utils))
    return metrics
