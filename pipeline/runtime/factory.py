"""Which backend runs this process: DeepSpeed's when the launch resolved to it, torch's otherwise."""
from __future__ import annotations

from pipeline.config.schema import SettledTrain
from pipeline.runtime.backend import Backend
from pipeline.runtime.deepspeed_backend import DeepSpeedBackend
from pipeline.runtime.dist import Runtime
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.torch_backend import TorchBackend


def make_backend(rt: Runtime, policy: PrecisionPolicy, train: SettledTrain, deepspeed_path: str | None) -> Backend:
    """The backend for rt.backend. A DeepSpeed config (deepspeed_path, or ds_configs/zero2.json when
    unset) is read, resolved and checked here, before any model is built; the deepspeed package
    itself is imported only when DeepSpeedBackend.prepare runs (importing it costs seconds). `train`
    is settled (jobs/settle.py): train.compile names a mode."""
    if rt.backend == "deepspeed":
        return DeepSpeedBackend(rt, policy, train, deepspeed_path)
    return TorchBackend(rt, policy, train.max_grad_norm, train.compile)
