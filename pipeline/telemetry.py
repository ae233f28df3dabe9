"""Measurements of a run: throughput over training steps only, peak memory, device facts.

Clocks are read only after the device is synchronized, so queued GPU work is not missed.
"""
from __future__ import annotations

import importlib.metadata
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: waits for all queued kernels


class ThroughputMeter:
    """Samples, non-padding tokens and seconds of training steps (eval and saving excluded)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.samples = 0
        self.tokens = 0
        self.seconds = 0.0
        self._t0: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        synchronize(self.device)
        elapsed = time.perf_counter() - self._t0
        self.seconds += elapsed
        self._t0 = None
        return elapsed

    def add(self, samples: int, tokens: int) -> None:
        self.samples += samples
        self.tokens += tokens


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak memory in MB under the name that says what it is (CUDA allocator or process RSS)."""
    if device.type == "cuda":
        return {"perf/peak_mem_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
                "perf/peak_mem_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}
    # ru_maxrss is KiB on Linux; it is the peak since process start (it cannot be reset)
    return {"perf/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


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
            tags["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return tags


# ---------------------------------------------------------------------- compute

# Dense peak TFLOP/s from the vendors' data sheets, per precision mode. A device that is not
# listed gets no MFU: a guessed peak would make the figure meaningless.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM5
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
}


def peak_tflops(device_name: str, precision_name: str) -> float | None:
    for model, table in PEAK_TFLOPS.items():
        if model in device_name:
            return table.get(precision_name)
    return None


# ---------------------------------------------------------------------- energy


class EnergyMeter:
    """GPU energy from NVML's total-energy counter (mJ since driver load), read at the edges
    of the measured interval; plus the mean GPU utilization sampled once a second.

    available is False on a CPU, without NVML, or on a GPU whose counter cannot be read:
    then nothing is reported, never a zero or an estimate.
    """

    def __init__(self, device: torch.device):
        self.available = False
        self.uuid: str | None = None
        self._handle = None
        self._start_mj = 0
        self.joules = 0.0
        self._util: list[float] = []
        self._stop = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)  # raises where unsupported
            self._nvml = pynvml
            self.available = True
        except Exception:  # noqa: BLE001 - no NVML, no permission, pre-Volta GPU
            self.available = False

    def start(self) -> None:
        if not self.available:
            return
        import threading

        self._start_mj = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        self._util = []
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def stop(self) -> float:
        """Joules used since start() (0.0 if unavailable; callers check .available)."""
        if not self.available:
            return 0.0
        self._stop.set()
        joules = (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start_mj) / 1000.0
        self.joules += joules
        return joules

    @property
    def mean_utilization(self) -> float | None:
        return sum(self._util) / len(self._util) if self._util else None

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except Exception:  # noqa: BLE001
                return
