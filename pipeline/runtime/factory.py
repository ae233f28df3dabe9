"""Which backend runs this process: DeepSpeed's when the launch resolved to it, torch's otherwise."""
from __future__ import annotations

from pipeline.config.deepspeed_files import refuse_fp16_on_cpu
from pipeline.config.schema import SettledTrain
from pipeline.runtime.backend import Backend
from pipeline.runtime.compiler import CompilePolicy
from pipeline.runtime.deepspeed_backend import DeepSpeedBackend
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime


def refuse_unsupported(rt: Runtime, policy: PrecisionPolicy) -> None:
    """What this launch's backend cannot run at this precision, refused with the plan, before any
    model is built: DeepSpeed's fp16 on a CPU (a CPU's own fp16 kernels let the policy resolve)."""
    if rt.backend == "deepspeed" and policy.name == "fp16":
        refuse_fp16_on_cpu(policy.name, rt.device.type)


def make_backend(rt: Runtime, policy: PrecisionPolicy, compile_policy: CompilePolicy, train: SettledTrain,
                 deepspeed_path: str | None) -> Backend:
    """The backend for rt.backend. A DeepSpeed config (deepspeed_path, or the shipped zero2.json when
    unset) is read, resolved and checked here, before any model is built; the deepspeed package
    itself is imported only when DeepSpeedBackend.prepare runs (importing it costs seconds). The
    compile policy was settled with the plan (job/plan.py); the backend holds it."""
    if rt.backend != "deepspeed":
        return TorchBackend(rt, policy, train.max_grad_norm, compile_policy)
    return DeepSpeedBackend(rt, policy, train, deepspeed_path, compile_policy)
