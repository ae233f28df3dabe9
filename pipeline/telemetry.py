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
