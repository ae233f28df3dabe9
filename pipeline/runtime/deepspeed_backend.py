"""The DeepSpeed backend: runtime.backend.Backend driven by DeepSpeed's engine.

The DeepSpeed JSON may say "auto" for what the pipeline already knows (micro-batch,
accumulation, global batch, clipping, optimizer lr/betas/eps/weight decay, the fp16/bf16
blocks from `precision`); those are filled from the config. A value set in both places that
disagrees is a UserError naming both, never a silent override.

The loop owns gradient accumulation (managed_gradient_accumulation=false: every step() is the
boundary) and the LR schedule (stepped only when the engine says the step was applied), so
the two backends behave alike. With an `optimizer` block the engine builds that optimizer
(e.g. DeepSpeedCPUAdam under offload) over the pipeline's parameter groups, so biases and
LayerNorm weights keep no weight decay, and the loop's schedule is built over it (self.optimizer,
the engine's basic optimizer): the logged train/lr is the lr applied.

Precision (DeepSpeed 0.19.8, read in its engine.py, torch_autocast.py and ZeRO optimizers, run on
its CPU accelerator for stages 0-3):
- bf16 is torch autocast, as under torchrun: DeepSpeed's `torch_autocast` section with the bf16
  block off, so the module and the optimizer's master weights stay fp32 and LayerNorm, softmax and
  the loss run in fp32 (the bf16 block would cast the whole module to bf16 and turn autocast off
  inside the engine's forward). Tag precision_mode=autocast.
- fp16 is DeepSpeed's own fp16 mode: the module in fp16, fp32 master weights inside the optimizer,
  its dynamic loss scaler (the only fp16 path whose skipped steps and clipping are right: with
  `torch_autocast` fp16 the ZeRO-1/2/3 optimizers clip and report the gradients still multiplied
  by their GradScaler's scale and return before the scaler's update on an overflow, and ZeRO-0's
  torch optimizer has no overflow flag, so a skipped step counts as applied). Not the same AMP as
  torchrun's fp16: tag precision_mode=pure16, never one column with autocast rows.
- bf16-pure is refused in one line: DeepSpeed's own bf16 block is that design (the module in bf16,
  fp32 masters in BF16_Optimizer or the ZeRO partitions), but there the masters live in DeepSpeed's
  flat partitions, which this backend's full_state_dict (best/, the final test) does not read: it
  would keep the bf16-rounded module instead of the fp32 masters. Not run on any device here either.

ZeRO's bucket sizes may say "auto": filled at prepare() from the model's hidden size as the Hugging
Face integration does (reduce/allgather buckets hidden^2, ZeRO-3 prefetch 0.9 hidden^2, parameter
persistence 10 hidden), instead of DeepSpeed's 5e8-element defaults (gigabytes of buckets per GPU).

The deepspeed package is imported inside the methods that use it: importing it costs seconds,
and reading and checking the config must not.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline import names
from pipeline.config.deepspeed_files import check_supported, ds_config_file, load_ds_config, resolve_ds_config
from pipeline.config.precision_modes import PURE16
from pipeline.config.schema import SettledTrain, TrainConfig
from pipeline.errors import UserError
from pipeline.layout import CheckpointFiles, OutputDir
from pipeline.runtime.backend import StepResult
from pipeline.runtime.compiler import OFF, CompilePolicy, allow_shapes, compile_kwargs
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime

if TYPE_CHECKING:
    from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer
    from transformers import PretrainedConfig


BUCKET_SIZES = {  # ZeRO key -> its size from the model's hidden size h (transformers' DeepSpeed integration)
    "reduce_bucket_size": lambda h: h * h,
    "allgather_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


def fill_bucket_sizes(cfg: dict, model_config: PretrainedConfig | None) -> dict:
    """The ZeRO sizes that say "auto", filled from the model's hidden size (in place; returns what
    was filled). A number the user wrote is a tuning choice and stays. A model config without a
    hidden size leaves those keys to DeepSpeed's defaults."""
    zero = cfg.get("zero_optimization", {})
    wanted = [key for key in BUCKET_SIZES if zero.get(key) == "auto"]
    hidden = getattr(model_config, "hidden_size", None) or max(getattr(model_config, "hidden_sizes", None) or [0])
    filled = {}
    for key in wanted:
        if hidden:
            zero[key] = filled[key] = BUCKET_SIZES[key](hidden)
        else:
            del zero[key]
    return filled


def read_loss_scale(optimizer: DeepSpeedOptimizer) -> float | None:
    """The dynamic loss scale of a DeepSpeed fp16 optimizer: the ZeRO-0 FP16_Optimizer keeps it in
    loss_scale_config.cur_scale, the ZeRO-1/2/3 optimizers in cur_scale (as the engine's own
    _get_optimizer_loss_scale reads it)."""
    config = getattr(optimizer, "loss_scale_config", None)
    scale = config.cur_scale if config is not None else getattr(optimizer, "cur_scale", None)
    return None if scale is None else float(scale)


def precision_mode(policy: PrecisionPolicy, ds_config: dict) -> str:
    """A DeepSpeed fp16 or bf16 block makes the engine's module 16 bit (pure16); else the mode's
    own, as under torchrun (autocast through the torch_autocast block)."""
    own = any(ds_config.get(block, {}).get("enabled") is True for block in ("fp16", "bf16"))
    return PURE16 if own else policy.mode


def skip_the_shm_all_reduce_build() -> None:
    """DeepSpeed's CPU accelerator compiles a C++ shared-memory all-reduce (`deepspeed_shm_comm`)
    when its communication backend starts, once per environment: 1-2.5 minutes on a 2-core machine
    before the first step. Only its inference_all_reduce (tensor-parallel inference) uses that op;
    training's all-reduces and gathers go through torch.distributed (gloo) either way. Marking the
    op incompatible in DeepSpeed's per-process table (deepspeed.ops.__compatible_ops__, which its
    comm backend consults) skips the build and changes no result."""
    import deepspeed
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


class DeepSpeedBackend:
    """Launched by the deepspeed launcher (or torchrun with backend=deepspeed): ZeRO stages 0-3."""

    def __init__(self, rt: Runtime, policy: PrecisionPolicy, train: SettledTrain, config_path: str | None,
                 compile: CompilePolicy = OFF):
        """config_path: the DeepSpeed JSON (the `deepspeed` key); None uses the shipped zero2.json.
        `compile` was settled with the plan for this ZeRO stage (compiler.resolve): not resolved again."""
        if policy.spec.deepspeed is None:
            raise UserError(f"precision={policy.name} with backend=deepspeed: not supported (DeepSpeed keeps the fp32 "
                            f"master weights in its own partitions); use precision={policy.arithmetic}, or "
                            "backend=ddp")
        self.rt = rt
        self.policy = policy
        self.engine = None
        self.compile = compile
        self.source = str(ds_config_file(config_path) or config_path)
        self.raw = load_ds_config(config_path)
        self.ds_config = resolve_ds_config(self.raw, train, policy.name, rt.world_size, self.source)
        self.zero_stage = check_supported(self.ds_config, policy.name, rt.device.type, self.source)
        self.precision_mode = precision_mode(policy, self.ds_config)

    @property
    def fused_optimizer(self) -> bool:
        return False  # the engine wraps the optimizer in its own partitioned one

    @property
    def shards_parameters(self) -> bool:
        return self.zero_stage == 3

    def standing_bytes(self, model: torch.nn.Module) -> int:
        """None counted: ZeRO's partitions and buckets replace what a bare step holds (its gradients,
        AdamW's state), so a bare step's peak is an upper bound."""
        return 0

    def describe(self) -> dict[str, object]:
        return {"deepspeed_stage": self.zero_stage, **self.compile.describe()}

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                train: TrainConfig | None = None) -> torch.nn.Module:
        """The engine, its micro-batch and accumulation "auto" values from `train` when given (the
        split batch_size=auto found after the config was read and checked)."""
        import deepspeed

        if train is not None:
            self.ds_config = resolve_ds_config(self.raw, train, self.policy.name, self.rt.world_size, self.source)
        if self.rt.device.type == "cpu":
            skip_the_shm_all_reduce_build()
        fill_bucket_sizes(self.ds_config, getattr(model, "config", None))
        client_optimizer = None if "optimizer" in self.ds_config else optimizer
        # the JSON's optimizer is built over these groups (engine._configure_basic_optimizer passes
        # model_parameters to its constructor): each group's weight_decay overrides the block's
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=client_optimizer, model_parameters=None if client_optimizer else groups,
            config=self.ds_config)
        # the torch optimizer inside ZeRO's wrapper: its groups' lr is what steps (the engine's own
        # client lr_scheduler is built over it too, engine.py _configure_lr_scheduler)
        self.optimizer = self.engine.basic_optimizer
        self.module = self.engine.module
        self.model = self.engine
        if self.compile.compiled:  # the engine compiles its module in place (keys unchanged)
            allow_shapes()
            self.engine.compile(compile_kwargs=compile_kwargs(self.compile.mode))
        return self.engine

    def no_sync(self):
        # unmanaged accumulation: ZeRO reduces per backward; step() is the boundary
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loop already divided by the group length

    def step(self) -> StepResult:
        if self.zero_stage == 0 and not self.engine.fp16_enabled():
            return self._plain_optimizer_step()
        self.engine.step()
        norm = self.engine.get_global_grad_norm()  # a tensor or a float, depending on the ZeRO stage
        norm = torch.as_tensor(float("nan") if norm is None else norm)  # no host read: logged at boundaries
        return StepResult(bool(self.engine.was_step_applied()), norm)

    def _plain_optimizer_step(self) -> StepResult:
        """ZeRO-0 without DeepSpeed's fp16 optimizer steps a plain torch optimizer: the engine then
        neither reports the gradient norm nor skips a non-finite update (it has no overflow flag),
        so both are done here, as the torch backend does (one device sync per step)."""
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.module.parameters() if p.grad is not None])
        stepped = bool(torch.isfinite(norm))
        if stepped:
            self.engine.step()
        else:  # not even engine.step(): it would fill the missing gradients with zeros and AdamW's momentum moves on
            self.engine.optimizer.zero_grad(set_to_none=True)
        return StepResult(stepped, norm)

    @property
    def loss_scale(self) -> float | None:
        return read_loss_scale(self.engine.optimizer) if self.engine.fp16_enabled() else None

    # ------------------------------------------------------------------ state
    def save(self, directory: Path, rank: int) -> None:
        """Collective: DeepSpeed's own checkpoint (every rank writes its ZeRO partitions)."""
        self.engine.save_checkpoint(str(directory), tag=CheckpointFiles.ENGINE, save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag=CheckpointFiles.ENGINE,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load its checkpoint from {directory}")

    def full_state_dict(self) -> dict:
        """Collective: the whole model on every rank, on CPU (gathered from ZeRO-3 partitions)."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in self.module.state_dict().items()}

    def load_full_state_dict(self, state: dict) -> None:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=0):
            self.module.load_state_dict(state)

    @property
    def extra_artifacts(self) -> dict[str, object]:
        return {OutputDir.DEEPSPEED_CONFIG: self.ds_config}

    @property
    def extra_tags(self) -> dict[str, str]:
        return {names.TAG_PRECISION_MODE: self.precision_mode}
