"""bf16-pure's copies between the module's bf16 weights and the optimizer's fp32 masters, batched
into one foreach call per direction (benchmarks/master_weights_batched.py, a bench_gpu.py variant): the same values
as the per-parameter copies, bit for bit. Only the copies run here (no bf16 matmul: this CPU
emulates it); what the batching saves is a GPU figure."""
import contextlib

import pytest
import torch

from helpers import bench_module
from pipeline.runtime.master_weights import MasterWeights


def one_step(batched: bool):
    """A module cast to bf16 under MasterWeights, bf16 gradients on all but the last layer's weight
    (as after a backward that did not reach it), the fp32 masters' gradients, an AdamW step, the copy down."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3, bias=False))
    before = [p.detach().clone() for p in module.parameters()]
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    weights = MasterWeights(module, optimizer, torch.bfloat16)
    for p in list(module.parameters())[:-1]:
        p.grad = torch.randn_like(p)
    with bench_module("master_weights_batched").batched() if batched else contextlib.nullcontext():
        weights.grads_to_master()
        grads = [None if m.grad is None else m.grad.clone() for m in weights.master]
        optimizer.step()
        weights.copy_down()
    after = [p.detach().clone() for p in module.parameters()]
    return before, grads, [m.detach().clone() for m in weights.master], after


def test_batched_copies_give_the_per_parameter_copies_values():
    before, grads, masters, module = one_step(batched=True)
    _, ref_grads, ref_masters, ref_module = one_step(batched=False)
    assert all(g.dtype == torch.float32 and torch.equal(g, r) for g, r in zip(grads[:-1], ref_grads[:-1]))
    assert all(torch.equal(m, r) for m, r in zip(masters, ref_masters))
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, r) for p, r in zip(module, ref_module))
    # the step reached the module: the stepped masters rounded to bf16, not the initial weights
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(module, masters))
    assert not torch.equal(module[0], before[0].to(torch.bfloat16))


@pytest.mark.parametrize("batched", [False, True])
def test_a_parameter_without_gradient_gets_no_master_gradient(batched):
    _, grads, _, _ = one_step(batched)
    assert grads[-1] is None and all(g is not None for g in grads[:-1])
