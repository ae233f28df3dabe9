"""The library APIs that differ across the supported torch and transformers versions (pyproject.toml's
floors up to the newest tested; README, "Versions tested"), each asked for here and nowhere else; and
what the pipeline must take from a library's private modules (MLflow's), each with the version read.

Each branch tests for the feature, not the version number, and names the library source lines it relies
on in each version. torch, transformers and mlflow are imported inside the functions: this module sits in the
lowest layer (docs/ARCHITECTURE.md) and loads without them.

May import: nothing from the pipeline.
"""
from __future__ import annotations

import inspect
from typing import Any


def ddp_without_forward_buffer_sync(module: Any, device_ids: list[int] | None) -> Any:
    """`module` wrapped in DistributedDataParallel that does not broadcast rank 0's buffers before every
    forward. The pipeline's models hold constant buffers only (position and token-type ids, registered by
    the embeddings), so one copy at construction or none (every rank builds the same) is all they need.

    torch 2.13 (torch/nn/parallel/distributed.py: `forward_sync_buffers: bool | None = None` in
    `DistributedDataParallel.__init__`, lines 816-838; `broadcast_buffers` deprecated with a FutureWarning,
    lines 961-980): forward_sync_buffers=False, which still syncs buffers at init (line 984).
    torch 2.11 (the same file: `broadcast_buffers=True` in `__init__`, lines 655-675, no `**kwargs`, so
    the newer keyword is a TypeError; kept as `self.broadcast_buffers`, line 799, and used for the init
    sync, line 889): broadcast_buffers=False, which also skips the init sync of buffers; safe for the
    same reason (every rank builds the same constants)."""
    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(module, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(module, device_ids=device_ids, broadcast_buffers=False)


def enable_activation_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing of every GradientCheckpointingLayer of a transformers
    model (the reentrant variant breaks DDP, "marked ready twice", and needs inputs that require grad).

    transformers 5.24 and newer (modeling_utils.py: `PreTrainedModel.activation_checkpointing_enable`,
    line 3119; `gradient_checkpointing_enable` is its deprecated alias with a FutureWarning, line 3200).
    transformers 5.17 (modeling_utils.py: `gradient_checkpointing_enable(gradient_checkpointing_kwargs=
    None, every_n_layers=1, offload=False)`, line 3106; no activation_checkpointing_enable). Both pass the
    kwargs to torch.utils.checkpoint.checkpoint through functools.partial and set each layer's
    `gradient_checkpointing` flag (`_set_gradient_checkpointing`)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpoint_reruns_module_hooks() -> bool:
    """Whether activation checkpointing runs a layer's module hooks again in the backward recompute.

    transformers 5.24 (modeling_layers.py: `GradientCheckpointingLayer.__init_subclass__`, lines 83-126)
    wraps each layer class's `forward`, so the layer's `__call__` and its hooks (DeepSpeed ZeRO-3's
    parameter gather/release, any forward hook) stay outside the checkpoint and run once. transformers
    5.17 (modeling_layers.py: `GradientCheckpointingLayer.__call__`, lines 80-109) checkpoints
    `super().__call__`, hooks included: its forward pre-hooks run again when the backward recomputes the
    layer (ZeRO-3 gathers the layer's parameters a second time; the results are the same); its forward
    hooks do not, as torch's non-reentrant recompute stops once the last saved tensor is recomputed
    (torch/utils/checkpoint.py of 2.11: `_StopRecomputationError`, lines 1077 and 1120; early stop is
    on by default, `set_checkpoint_early_stop`, line 755). DDP's gradient hooks sit on the parameters'
    autograd nodes, not on modules, and fire once per gradient in both."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" in vars(GradientCheckpointingLayer)


def system_metrics_monitor(run_id: str, interval: float, node_id: str, uri: str) -> Any:
    """MLflow's system-metrics sampler (CPU, memory, disk, network, GPU) for a run the pipeline opened
    through a client, logging under system/NODE_ID/ to `uri`; start() and finish() it.

    The public route, mlflow.start_run(log_system_metrics=True), makes the run the process's active
    run and ends it with mlflow.end_run: on every node of a multi-node job the first node to finish
    would end the shared run. The class it starts is not exported by mlflow.system_metrics (whose
    public functions only configure that route): mlflow 3.17 (mlflow/system_metrics/
    system_metrics_monitor.py: `SystemMetricsMonitor.__init__(run_id, sampling_interval=10,
    samples_before_logging=1, resume_logging=False, node_id=None, tracking_uri=None)`, line 55;
    start(), line 105; finish(), line 187, which flushes); the same signature on MLflow's main branch."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    return SystemMetricsMonitor(run_id, sampling_interval=interval, node_id=node_id, tracking_uri=uri)
