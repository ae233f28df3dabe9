"""How busy the machine was with other work while a segment was timed (LoadSampler).

A speed figure measured on a shared machine is the machine's as much as the model's: a core
another process keeps busy, or a neighbour on the GPU, slows a run by an amount nothing else in
its figures shows. Once a second, while a segment runs, the sampler reads:

- CPU: the machine's busy CPU time (psutil.cpu_times(): every state but idle and iowait; steal,
  time a hypervisor gave to other guests, counts as busy) less the CPU time of this job's own
  process tree (this process and its descendants; under torchrun or the deepspeed launcher, with
  several local ranks, the launcher's tree, so the job's other ranks are not "other work"), as a
  share of the machine's logical cores: 0.5 on a 2-core machine = one core busy elsewhere.
- GPU (NVML, where the device is CUDA and NVML answers): per process SM utilization over the
  interval (nvmlDeviceGetProcessUtilization), split into this job's processes and the others, and
  the processes running on the GPU (nvmlDeviceGetComputeRunningProcesses) that are not this job's.
  Where NVML lists no process of this job although the job runs on the GPU (a container whose PID
  namespace differs from the host's, whose PIDs NVML reports), the GPU figures are left out: NVML's
  PIDs cannot be told apart, and every process would read as another's.

Segments: start() ... stop() (an epoch; pause() and resume() leave out a checkpoint save, as the
throughput clock does). The sampler owns its thread and its totals and touches no collective;
its figures are this process's (the run logs global rank 0's: its node, its GPU).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace

import torch

from pipeline import names

INTERVAL_S = 1.0
"""Seconds between readings (a segment shorter than this still gets one reading, at its end)."""


@dataclass
class LoadFigures:
    """One segment's (or the job's) load: sums over its readings, and the figures they give as
    properties. A figure is None where not measured (no GPU, no NVML, PIDs not NVML's)."""

    seconds: float = 0.0
    others_cpu_s: float = 0.0
    """Other processes' CPU seconds, in core-seconds / cores (so / seconds gives the share)."""
    others_cpu_max: float | None = None
    """The busiest reading's share of the machine's cores busy with other processes."""
    gpu_seconds: float = 0.0
    others_gpu_pct_s: float = 0.0
    own_pct_s: float = 0.0
    used_pct_s: float = 0.0
    gpu_procs: int | None = None
    gpu_known: bool = True
    """False once a reading could not tell this job's GPU processes from the others'."""

    def add(self, other: LoadFigures) -> None:
        self.seconds += other.seconds
        self.others_cpu_s += other.others_cpu_s
        self.others_cpu_max = _max(self.others_cpu_max, other.others_cpu_max)
        self.gpu_seconds += other.gpu_seconds
        self.others_gpu_pct_s += other.others_gpu_pct_s
        self.own_pct_s += other.own_pct_s
        self.used_pct_s += other.used_pct_s
        self.gpu_procs = _max(self.gpu_procs, other.gpu_procs)
        self.gpu_known = self.gpu_known and other.gpu_known

    @property
    def others_cpu(self) -> float | None:
        """Mean share of the machine's cores busy with other processes (0-1)."""
        return self.others_cpu_s / self.seconds if self.seconds else None

    @property
    def _gpu(self) -> bool:
        return self.gpu_seconds > 0 and self.gpu_known

    @property
    def others_gpu_util(self) -> float | None:
        """Mean SM utilization of other processes on this GPU, % of the GPU."""
        return self.others_gpu_pct_s / self.gpu_seconds if self._gpu else None

    @property
    def own_gpu_share(self) -> float | None:
        """This job's share of the GPU's SM utilization (0-1), over the readings where the GPU was used."""
        return self.own_pct_s / self.used_pct_s if self._gpu and self.used_pct_s else None

    @property
    def others_gpu_procs(self) -> int | None:
        """The most processes of others seen running on this GPU at one reading."""
        return self.gpu_procs if self._gpu else None

    def figures(self, prefix: str = names.PERF) -> dict[str, float]:
        """The figures under their perf/ names (names.load_metric); those not measured left out."""
        values = {names.LOAD_OTHERS_CPU: self.others_cpu, names.LOAD_OTHERS_CPU_MAX: self.others_cpu_max,
                  names.LOAD_OTHERS_GPU_UTIL: self.others_gpu_util, names.LOAD_OWN_GPU_SHARE: self.own_gpu_share,
                  names.LOAD_OTHERS_GPU_PROCS: self.others_gpu_procs}
        return {names.load_metric(k, prefix): float(v) for k, v in values.items() if v is not None}


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def job_root_pid() -> int:
    """The process whose tree is this job: the launcher's (the parent) when it started several
    local ranks (LOCAL_WORLD_SIZE, set by torchrun and the deepspeed launcher), else this process."""
    return os.getppid() if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1 else os.getpid()


class LoadSampler:
    """Samples the machine's load from other work while its segments run (the module says how)."""

    def __init__(self, device: torch.device, interval_s: float = INTERVAL_S, root_pid: int | None = None):
        import psutil

        self._psutil = psutil
        self.interval_s = interval_s
        self.root_pid = root_pid or job_root_pid()
        self.cores = psutil.cpu_count() or 1
        self._nvml, self._handle = _open_nvml(device) or (None, None)
        """pynvml and the device's handle; None: no GPU figures (a CPU, no NVML, no permission)."""
        self._since = 0
        """NVML's samples are asked for from this timestamp (microseconds) on."""
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._last: tuple | None = None
        """(wall, machine busy CPU s, {pid: CPU s}) at the last reading of the running stretch."""
        self.segment = LoadFigures()
        self.job = LoadFigures()
        self.last: LoadFigures | None = None
        """The figures of the segment a `with` block timed."""

    # ------------------------------------------------------------------ segments
    def start(self) -> None:
        """A new segment (an epoch): figures from zero, sampling from now."""
        with self._lock:
            self.segment = LoadFigures()
        self.resume()

    def resume(self) -> None:
        if self._thread is not None:
            return
        self._last = self._read_cpu()
        self._since = int(time.time() * 1e6)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop sampling (a checkpoint save); the stretch so far is counted up to now."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._reading()

    def stop(self) -> LoadFigures:
        """End the segment: its figures (the job's totals include it)."""
        self.pause()
        with self._lock:
            self.job.add(self.segment)
            return replace(self.segment)

    def job_figures(self) -> LoadFigures:
        """Over every segment this process has timed."""
        with self._lock:
            return replace(self.job)

    def __enter__(self) -> LoadSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.last = self.stop()

    # ------------------------------------------------------------------ readings
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._reading()

    def _reading(self) -> None:
        """One interval since the last reading: others' CPU share and, on a GPU, NVML's samples."""
        try:
            now = self._read_cpu()
        except Exception:  # noqa: BLE001 - a process vanishing mid-read: the next reading covers it
            return
        wall0, busy0, own0 = self._last
        wall, busy, own = now
        self._last = now
        dt = wall - wall0
        if dt <= 0:
            return
        # processes of the tree seen both times: their increase; new ones: all of theirs (forked since)
        ours = sum(max(0.0, t - own0.get(pid, 0.0)) for pid, t in own.items())
        share = min(1.0, max(0.0, (busy - busy0 - ours) / (dt * self.cores)))
        part = LoadFigures(seconds=dt, others_cpu_s=share * dt, others_cpu_max=share)
        if self._nvml is not None:
            gpu = self._read_gpu(set(own))
            if gpu is None:
                part.gpu_known = False
            else:
                others, mine, procs = gpu
                part.gpu_seconds = dt
                part.others_gpu_pct_s, part.own_pct_s, part.used_pct_s = others * dt, mine * dt, (others + mine) * dt
                part.gpu_procs = procs
        with self._lock:
            self.segment.add(part)

    def _read_cpu(self) -> tuple[float, float, dict[int, float]]:
        times = self._psutil.cpu_times()
        busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
        busy -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # Linux: counted in user already
        own: dict[int, float] = {}
        try:
            root = self._psutil.Process(self.root_pid)
            tree = [root, *root.children(recursive=True)]
        except self._psutil.Error:
            tree = [self._psutil.Process()]
        for p in tree:
            try:
                t = p.cpu_times()
                own[p.pid] = t.user + t.system
            except self._psutil.Error:  # exited meanwhile
                continue
        return time.monotonic(), busy, own

    def _read_gpu(self, ours: set[int]) -> tuple[float, float, int] | None:
        """(others' SM %, this job's SM %, others' processes) since the last read; None where NVML
        lists processes but none of this job's (its PIDs are another namespace's)."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(self._handle, self._since)
        except nvml.NVMLError_NotFound:  # no process sampled since: the GPU idled
            samples = []
        except nvml.NVMLError:
            return None
        try:
            running = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)}
        except nvml.NVMLError:
            return None
        if samples:
            self._since = max(s.timeStamp for s in samples)
        by_pid: dict[int, list[int]] = {}
        for s in samples:
            by_pid.setdefault(s.pid, []).append(s.smUtil)
        if (running or by_pid) and not (ours & (running | set(by_pid))):
            return None
        mean = {pid: sum(v) / len(v) for pid, v in by_pid.items()}
        mine = sum(u for pid, u in mean.items() if pid in ours)
        others = sum(u for pid, u in mean.items() if pid not in ours)
        return float(min(100.0, others)), float(min(100.0, mine)), len(running - ours)


def _open_nvml(device: torch.device) -> tuple | None:
    """(pynvml, the device's handle): per-process GPU use from NVML (the nvidia-ml-py package)."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # noqa: BLE001 - no NVML, no permission: no GPU figures, never a guess
        return None
