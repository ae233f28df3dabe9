"""bench_gpu.py's `pure-batched` variant: bf16-pure's copies between the module's bf16 weights and
the optimizer's fp32 masters (runtime/master_weights.py) batched into one foreach call per direction
(multi-tensor kernels on a GPU) rather than a cast kernel per parameter. The trainer keeps the
per-parameter copies until a GPU measures this; tests/unit/test_master_weights_batched.py checks that
both give the same values, bit for bit."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from pipeline.runtime.master_weights import MasterWeights


def grads_to_master(self: MasterWeights) -> None:
    """MasterWeights.grads_to_master in one foreach copy."""
    pairs = [(low.grad, master) for low, master in zip(self.low, self.master) if low.grad is not None]
    for low, master in zip(self.low, self.master):
        master.grad = None if low.grad is None else torch.empty_like(master)
    if pairs:
        torch._foreach_copy_([m.grad for _, m in pairs], [g for g, _ in pairs])


@torch.no_grad()
def copy_down(self: MasterWeights) -> None:
    """MasterWeights.copy_down in one foreach copy."""
    torch._foreach_copy_(self.low, self.master)


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Every MasterWeights copies batched while the block runs."""
    saved = MasterWeights.grads_to_master, MasterWeights.copy_down
    MasterWeights.grads_to_master, MasterWeights.copy_down = grads_to_master, copy_down
    try:
        yield
    finally:
        MasterWeights.grads_to_master, MasterWeights.copy_down = saved
