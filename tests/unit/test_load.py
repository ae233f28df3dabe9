"""How busy the machine was while a segment was timed (pipeline/measure/load.py): another
process's CPU time shows in a stage's logged perf/ figures, this job's own does not, and on a GPU
NVML's per-process use is split into this job's and the others'."""
import os
import time
from types import SimpleNamespace

import pytest
import torch

from pipeline import names
from pipeline.measure.load import LoadSampler

CPU = torch.device("cpu")


class StandInNvml:
    """NVML for a test: this machine has no NVIDIA GPU, so the per-process samples and the running
    processes that nvidia-ml-py returns on a GPU (pynvml.c_nvmlProcessUtilizationSample_t's pid,
    timeStamp, smUtil; c_nvmlProcessInfo_t's pid) are stood in for by what the test sets."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's name
        pass

    def __init__(self, samples: list[tuple[int, int]], running: list[int]):
        self.samples, self.running, self.asked_since = samples, running, []

    def nvmlDeviceGetProcessUtilization(self, handle, since):  # noqa: N802 - pynvml's name
        self.asked_since.append(since)
        if not self.samples:
            raise self.NVMLError_NotFound()
        return [SimpleNamespace(pid=pid, timeStamp=since + 1 + i, smUtil=sm, memUtil=0)
                for i, (pid, sm) in enumerate(self.samples)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802 - pynvml's name
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**20) for pid in self.running]


def test_gpu_use_is_split_into_this_jobs_and_the_others():
    me, neighbour = os.getpid(), 999_999
    nvml = StandInNvml(samples=[(me, 30), (me, 34), (neighbour, 60)], running=[me, neighbour])
    sampler = LoadSampler(CPU, interval_s=0.1)
    sampler._nvml, sampler._handle = nvml, "handle"  # what LoadSampler opens on a CUDA device
    sampler.start()
    time.sleep(0.35)
    figures = sampler.stop()
    assert figures.others_gpu_util == pytest.approx(60)  # per process: the mean of its samples
    assert figures.own_gpu_share == pytest.approx(32 / 92)
    assert figures.others_gpu_procs == 1
    assert nvml.asked_since[1] > nvml.asked_since[0]  # each read asks only for samples after the last
    metrics = figures.figures(names.INFER_LOAD)
    assert metrics["perf/infer_others_gpu_util_pct"] == pytest.approx(60)
    idle = StandInNvml(samples=[], running=[])  # NVML: no process sampled since
    sampler._nvml = idle
    assert sampler._read_gpu({me}) == (0.0, 0.0, 0)


def test_gpu_figures_are_left_out_where_nvml_pids_are_not_this_jobs():
    """In a container NVML reports the host's PIDs: none is this job's, and every process would read
    as another's; the figures are left out rather than blaming the job's own work on a neighbour."""
    nvml = StandInNvml(samples=[(4242, 95)], running=[4242])
    sampler = LoadSampler(CPU, interval_s=0.1)
    sampler._nvml, sampler._handle = nvml, "handle"
    sampler.start()
    time.sleep(0.25)
    figures = sampler.stop()
    assert figures.others_cpu is not None
    assert (figures.others_gpu_util, figures.own_gpu_share, figures.others_gpu_procs) == (None, None, None)
