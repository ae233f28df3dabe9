"""A stage's MLflow run as the job opens it: the resolved config.yaml, the run's name, tags and
params (the config as requested plus what actually ran), and system metrics on every node."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipeline import fsutil, names
from pipeline.config import Config, flatten
from pipeline.config.secrets import redact_config
from pipeline.layout import OutputDir
from pipeline.measure import telemetry
from pipeline.runtime import collectives
from pipeline.runtime.world import Runtime
from pipeline.tracking.store import resolve_experiment, source_of
from pipeline.tracking.tracker import Tracker

if TYPE_CHECKING:
    from pipeline.runtime.backend import Backend
    from pipeline.runtime.precision import PrecisionPolicy


@dataclass(frozen=True)
class StageRun:
    """What a stage's run records beyond its config."""

    kind: str
    """train | distill (the run's `stage` tag)."""
    model_spec: str
    precision: str
    """The resolved precision policy's name."""
    ran: dict[str, dict[str, Any]] = field(default_factory=dict)
    """what_ran(): `resolved.*` params and the backend's tags."""
    resumed: bool = False
    """The job continues from a checkpoint: it appends to its first attempt's journal."""
    resume_run_id: str | None = None
    """The run the checkpoint's job logged to, reopened; None if that job never reached MLflow."""
    supersedes: str | None = None
    """The run of an unfinished job this one started over from: retired once this run exists."""


def what_ran(cfg: Config, rt: Runtime, policy: PrecisionPolicy, backend: Backend, model_spec: str,
             kind: str) -> dict[str, dict[str, Any]]:
    """What actually runs, beside the config as requested (precision=auto, backend=auto): MLflow
    params `resolved.*` and the backend's tags, so the compare view needs no click-through."""
    t = cfg.train
    batch = f"<= {t.batch_tokens} tokens" if t.batch_tokens else t.batch_size
    params = {"precision": policy.name, "compute_dtype": str(policy.compute_dtype).removeprefix("torch."),
              "backend": rt.backend, "world_size": rt.world_size, "grad_accum": t.grad_accum,
              "global_batch": f"{batch} x {t.grad_accum} x {rt.world_size}" if t.batch_tokens
              else t.batch_size * t.grad_accum * rt.world_size,
              **backend.describe(), "model": model_spec, "lr": t.lr,
              "teacher": cfg.kd.teacher if kind == "distill" else None,
              "requested_world_size": rt.requested_world_size or rt.world_size}
    return {"params": {f"resolved.{k}": v for k, v in params.items()}, "tags": backend.extra_tags}


def start_stage_run(cfg: Config, rt: Runtime, uri: str, run: StageRun) -> Tracker:
    """Collective: write the resolved config.yaml, open the stage's MLflow run on rank 0 with its
    tags and params (a resumed job reopens its run and appends to its journal), and start system
    metrics on every node. Params are the config as requested plus `run.ran`'s. Returns the
    tracker, its run_id the same on every rank (None without tracking)."""
    out = Path(cfg.output_dir)
    tags = run_tags(cfg, rt, run)
    run_name = cfg.tracking.run_name or f"{cfg.task}-{run.model_spec.split('/')[-1]}-{run.precision}"
    resolved = write_config(cfg, rt, uri, run.model_spec)
    params = {**flatten(resolved), **{k: v for k, v in run.ran.get("params", {}).items() if v is not None}}
    tracker = Tracker(out, active=rt.is_main, resume=run.resumed)
    tracker.register_as = cfg.tracking.register_as
    try:
        tracker.start(uri, resolved["tracking"]["experiment"], run_name, tags, params,
                      resume_run_id=run.resume_run_id, supersedes=run.supersedes)
        tracker.log_artifact(OutputDir(out).config)
        tracker.run_id = collectives.broadcast_object(tracker.run_id)
        if cfg.tracking.system_metrics and rt.local_rank == 0:
            node = rt.rank // max(1, rt.world_size // rt.num_nodes)
            tracker.start_system_metrics(tracker.run_id, uri, f"node{node}-{socket.gethostname()}",
                                         cfg.tracking.system_metrics_interval)
    except BaseException:  # e.g. the journal on a full disk: the run must not stay RUNNING
        tracker.end("FAILED")
        raise
    return tracker


def write_config(cfg: Config, rt: Runtime, uri: str, model_spec: str | None = None) -> dict[str, Any]:
    """The config as the job resolved it (the model that ran, its tracking URI and experiment included),
    redacted: no secrets in the run's params or in output_dir/config.yaml, which rank 0 writes."""
    tracking = cfg.to_dict()["tracking"]
    resolved = redact_config({**cfg.to_dict(), "model": model_spec or cfg.model, "tracking": {**tracking, "uri": uri,
                                                            "experiment": resolve_experiment(cfg.tracking.experiment)}})
    if rt.is_main:
        fsutil.write_text(OutputDir(cfg.output_dir).config,
                          yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))
    return resolved


def run_tags(cfg: Config, rt: Runtime, run: StageRun) -> dict[str, object]:
    """The run's tags: where and how it ran, the backend's tags, then the config's tracking.tags
    (which win), and the parent run of a study's cell."""
    tags = {
        names.TAG_TASK: cfg.task, names.TAG_MODEL: run.model_spec, names.TAG_PRECISION: run.precision,
        names.TAG_PRECISION_REQUESTED: cfg.precision, names.TAG_BACKEND: rt.backend, names.TAG_LAUNCHER: rt.launcher,
        names.TAG_WORLD_SIZE: rt.world_size, names.TAG_FALLBACK: "true" if rt.fallback else "false",
        names.TAG_REQUESTED_WORLD_SIZE: rt.requested_world_size or rt.world_size,
        names.TAG_NUM_NODES: rt.num_nodes, names.TAG_STAGE: run.kind, names.TAG_PROCEDURE: run.kind,
        names.TAG_DEVICE: telemetry.device_name(rt.device), names.TAG_DEVICE_TYPE: rt.device.type,
        names.TAG_SEED: cfg.seed, names.TAG_STUDY: "", names.TAG_OUTPUT_DIR: str(Path(cfg.output_dir).resolve()),
        # MLflow's own source tags: its run page and runs table show them
        names.TAG_SOURCE_NAME: f"python -m pipeline {run.kind}", names.TAG_SOURCE_TYPE: "LOCAL",
        names.TAG_USER: _user(),
        names.TAG_URI_FROM: source_of(cfg.tracking.uri, "MLFLOW_TRACKING_URI"),
        names.TAG_EXPERIMENT_FROM: source_of(cfg.tracking.experiment, "MLFLOW_EXPERIMENT_NAME"),
        **telemetry.environment_tags(), **run.ran.get("tags", {}), **cfg.tracking.tags,
    }
    if rt.device.type == "cpu":
        tags[names.TAG_CPU_BF16] = telemetry.cpu_bf16()
    if cfg.tracking.parent_run_id:
        tags[names.TAG_PARENT_RUN] = cfg.tracking.parent_run_id
    return tags


def _user() -> str:
    """The login running the job, as MLflow's fluent API names it (mlflow.user)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (a container)
        return "unknown"
