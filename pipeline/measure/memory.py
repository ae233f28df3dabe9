"""A device's memory as the batch finder sees it: how much there is (or the cap train.memory_limit_mb
puts on it), the peak a piece of work reaches, and whether it ran out.

GPU: the CUDA caching allocator's own limit and counters. `cap` calls
torch.cuda.set_per_process_memory_fraction(limit / total): in torch's allocator
(c10/cuda/CUDACachingAllocator.cpp, setMemoryFraction) the allowed bytes are that fraction of the
total cudaMemGetInfo reports, and a cudaMalloc that would take the memory it has reserved past them
raises torch.OutOfMemoryError, exactly as a card of that size would; the cap holds for the whole job.
The peak is max_memory_allocated; CUDA's context and NCCL's buffers are outside the allocator (inside
the finder's margin).

CPU: no allocator limit exists to set, and the alternatives do not stand for a device's memory:
RLIMIT_AS caps the address space, in which torch, MKL and the memory-mapped Arrow data reserve
gigabytes they never touch, and RSS counts the Python heap and libraries. So the tensors are
counted instead (`TensorBytes`, the storage-weakref bookkeeping of torch's own MemTracker,
torch/distributed/_tools/mem_tracker.py, without its per-module records): the model's parameters,
buffers, gradients and optimizer state at the start, then every storage an op creates until it dies;
past the cap the next op raises torch.OutOfMemoryError, as a device would. Its limits: the
allocator's overhead, library scratch buffers and Python objects are not counted, and the cap holds
only while counting (the batch finder's trials); the CPU job itself is limited by the machine's RAM.
"""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MIB = 2**20


def cap(device: torch.device, limit_mb: int | None) -> None:
    """Cap this process's memory on a GPU for the rest of the job (the allocator enforces it); on a
    CPU nothing process-wide (the finder's trials count against the limit: capacity)."""
    if limit_mb is None or device.type != "cuda":
        return
    total = torch.cuda.mem_get_info(device)[1]
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * MIB / total), device)


def capacity(device: torch.device, limit_mb: int | None) -> int:
    """Bytes this process may use: the cap, else on a GPU what is free plus what this process's
    allocator holds (another process's memory is not ours), on a CPU the memory available."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        mine = free + torch.cuda.memory_reserved(device)
        return min(mine, limit_mb * MIB) if limit_mb is not None else mine
    if limit_mb is not None:
        return limit_mb * MIB
    import psutil

    return psutil.virtual_memory().available


def peak_bytes(device: torch.device, standing: list[torch.Tensor], limit: int, work: Callable[[], object]) -> int:
    """The peak bytes `work()` reaches; torch.OutOfMemoryError past `limit` (the allocator's own on
    a GPU). `standing`: the tensors that live before the work starts (CPU: counted from the start)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        work()
        return torch.cuda.max_memory_allocated(device)
    with TensorBytes(standing, limit) as counter:
        work()
    return counter.peak


def release(device: torch.device) -> None:
    """Give back what a finished trial left: Python's cycles, then the allocator's cached blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


OUT_OF_MEMORY = ("can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_SUPPORTED")
"""Messages of running out that are not torch.OutOfMemoryError: the CPU allocator's, and the
library workspaces a GPU could not allocate (the strings accelerate's should_reduce_batch_size
checks; cuDNN reports an allocation it could not make as not supported)."""


def is_out_of_memory(e: BaseException) -> bool:
    """torch's OOM, or another way a step says it ran out of memory."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and any(text in str(e) for text in OUT_OF_MEMORY))


class TensorBytes(TorchDispatchMode):
    """Live tensor bytes on CPU: the standing tensors' storages, plus each storage an op creates,
    until it is freed (a weakref on the storage); `peak` is the most at once. Past `limit` the op
    that crossed it raises torch.OutOfMemoryError."""

    def __init__(self, standing: list[torch.Tensor], limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.seen: dict[int, weakref.ref] = {}
        self.live = 0
        for t in standing:
            self._add(t)
        self.peak = self.live

    def _add(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.is_meta:
            return
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if not key or key in self.seen:
            return
        size = storage.nbytes()
        self.live += size

        def freed(_ref: weakref.ref, key: int = key, size: int = size) -> None:
            self.live -= size
            self.seen.pop(key, None)

        self.seen[key] = weakref.ref(storage, freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._add(t)
        self.peak = max(self.peak, self.live)
        if self.live > self.limit:
            raise torch.OutOfMemoryError(f"{self.live / MIB:.0f} MiB of tensors, over the cap of "
                                         f"{self.limit / MIB:.0f} MiB")
        return out
