"""fp32 master weights inside the optimizer for a module that holds bf16 weights (precision=bf16-pure).

The design of DeepSpeed's bf16 mode (deepspeed/runtime/bf16_optimizer.py, BF16_Optimizer): the
module's parameters are bf16, so its matmuls read them as they are (no cast kernel
per weight per step, as autocast needs for fp32 weights); the optimizer steps fp32 copies of them,
and its moments are fp32 because torch's optimizers keep state in their parameters' dtype. A step
copies the bf16 gradients into fp32 gradients of the copies, steps those and copies the result down
into the module (DeepSpeed's update_lp_params). What differs from DeepSpeed: the gradients
accumulate (over accumulation micro-steps) and are all-reduced (DDP) in bf16, the module's own
dtype, as FSDP's MixedPrecision(param_dtype=bfloat16) does by default; DeepSpeed adds each
micro-step's bf16 gradients into fp32 ones after every backward (update_hp_grads).

Torch's LayerNorm and softmax kernels read and write bf16 but compute their statistics in fp32
(acc_type / opmath_t of BFloat16 is float in aten's layer_norm and softmax kernels), so nothing
here upcasts them.
"""
from __future__ import annotations

import torch


class MasterWeights:
    """The optimizer's parameters replaced by fp32 copies of the module's, which is then cast to
    `dtype`. The optimizer object, its param groups and any LR schedule built on it stay the same
    objects: only each group's params list is swapped (before the first step, so no state moves), as
    BF16_Optimizer sets its wrapped optimizer's groups to its fp32 partitions."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype):
        by_id = {id(p): name for name, p in module.named_parameters()}
        self.names: list[str] = []
        self.low: list[torch.nn.Parameter] = []
        self.master: list[torch.Tensor] = []
        for group in optimizer.param_groups:
            masters = []
            for p in group["params"]:
                if id(p) not in by_id:
                    raise ValueError("the optimizer steps a parameter that is not the module's")
                self.names.append(by_id[id(p)])
                self.low.append(p)
                masters.append(p.detach().clone().float())
            self.master += masters
            group["params"] = masters
        module.to(dtype)  # in place: self.low are the module's parameters, now in dtype

    def broadcast_from(self, src: int) -> None:
        """DDP broadcasts rank `src`'s module when it wraps it; the fp32 copies follow it too."""
        import torch.distributed as tdist

        for m in self.master:
            tdist.broadcast(m, src)

    def grads_to_master(self) -> None:
        """The module's bf16 gradients as fp32 gradients of the copies (the optimizer reads those)."""
        for low, master in zip(self.low, self.master):
            master.grad = None if low.grad is None else low.grad.float()

    @torch.no_grad()
    def copy_down(self) -> None:
        """The stepped fp32 copies into the module's bf16 weights (rounded to nearest)."""
        for low, master in zip(self.low, self.master):
            low.copy_(master)

    def state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The module's state dict with every trained parameter as its fp32 copy (what checkpoints
        and best/ keep); other float entries (a tied parameter's second name) in fp32 too."""
        state = {k: v.float() if v.is_floating_point() else v for k, v in module.state_dict().items()}
        state.update(zip(self.names, self.master))
        return state

    @torch.no_grad()
    def load_state_dict(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Weights in any float dtype: into the fp32 copies exactly, into the module rounded."""
        module.load_state_dict(state)
        for name, master in zip(self.names, self.master):
            master.copy_(state[name])
