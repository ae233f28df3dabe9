"""A job settled once: the raw config and the runtime turned into a typed plan.

`settle()` is the one place a job's derived values are decided, before any data or model loads:
the world it runs on (joined here unless given: world.init; the fallback to fewer devices:
runtime/fallback.py), the precision policy,
the task, every default an unset key or `auto` stands for (output_dir; with the device, the
compile mode, the padding multiple and the loader workers; with the task and the kind of model,
the learning rate, the epochs and length grouping; batch_size=auto's global batch), and the part
of the job's record a resume compares that is known before anything loads (the record itself is
pipeline/job_record.py). One thing is left for later, by name: under batch_size=auto the
split of the global batch into micro-batches (Plan.find_batch), which only the built model on its
device can measure (batch_finder.fit_batch, Plan.resplit): until then the plan holds the default
split of that global batch, a job that runs as it is. Every later reader takes the plan:
`Plan.cfg` is a `SettledConfig`, whose types say that nothing in it is unset or `auto`.
Resolving changes no process-wide setting: the stage applies the matmul mode and the memory cap
when it starts (stage.build_stage).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline import models
from pipeline.config import Config, DataConfig
from pipeline.config.output_dir import default_output_dir
from pipeline.config.schema import SettledConfig, SettledTrain, TrainConfig, shallow_fields, to_record
from pipeline.data import features
from pipeline.job_record import KINDS, JobRecord
from pipeline.layout import OutputDir
from pipeline.runtime import compiler, factory, precision, world
from pipeline.runtime.compiler import CompilePolicy
from pipeline.runtime.fallback import fit_to_world
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task
from pipeline.tasks.base import Task

PRESET_LR = 3e-4
"""The learning rate of presets trained from scratch: a larger step than fine-tuning takes."""
FINGERPRINTED_SPLITS = ("train", "dev")
"""The splits a job's optimization and model selection read (test is only evaluated at the end)."""
AUTO_BATCH = 16
"""batch_size=auto's rows per rank and accumulation group: the default batch_size, so the global
batch is that of the default (16 x grad_accum x world size), whatever the card."""


@dataclass(frozen=True)
class Plan:
    """What a job is, decided once (settle)."""

    cfg: SettledConfig
    rt: Runtime
    """The runtime the job runs on (after the fallback to the devices there are)."""
    kind: str
    """train | distill."""
    task: Task
    policy: PrecisionPolicy
    record: JobRecord
    """The job asked for, known before any data or model loads (JobRecord.built completes it)."""
    compile: CompilePolicy
    """train.compile for this device and backend, and why (runtime/compiler.py)."""
    find_batch: bool = False
    """train.batch_size=auto: the global batch is settled (AUTO_BATCH x grad_accum x world size);
    its split into micro-batch x grad_accum, and eval_batch_size, are left to the batch finder
    (batch_finder.py) once the model is built (resplit)."""
    batch_found: str | None = None
    """Once resplit by the batch finder: what it chose and measured, in a line (the batch_fit tag)."""

    @property
    def out(self) -> OutputDir:
        return OutputDir(self.cfg.output_dir)

    def resplit(self, batch_size: int, grad_accum: int, eval_batch_size: int, found: str | None = None) -> Plan:
        """The same job (a built Stage stays built) with its global batch split otherwise on this
        device (the batch finder's answer): the one part of a settled job that may change after
        settle, as the split is what same_job lets a resumed job change (COMPARED_ELSEWHERE: only
        the global batch counts)."""
        t = self.cfg.train
        if batch_size * grad_accum != t.batch_size * t.grad_accum:
            raise ValueError(f"resplit: {batch_size} x {grad_accum} is another global batch than "
                             f"{t.batch_size} x {t.grad_accum}")
        split = {"batch_size": batch_size, "grad_accum": grad_accum, "eval_batch_size": eval_batch_size}
        cfg = dataclasses.replace(self.cfg, train=dataclasses.replace(t, **split))
        record = dataclasses.replace(self.record, config={**self.record.config,
                                                          **{f"train.{k}": v for k, v in split.items()}})
        return dataclasses.replace(self, cfg=cfg, record=record, find_batch=False, batch_found=found)


def settle(cfg: Config, kind: str, rt: Runtime | None = None) -> Plan | None:
    """The job's plan from its validated config and the runtime (a UserError for what this device
    cannot run); without `rt`, this process joins the job's world first (world.init), and a surplus
    torchrun rank under the fallback gets None (the others do the work). The distill stage's default
    student (from_teacher:N) needs the teacher, but only the kind of model matters to the defaults
    decided here."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {KINDS}")
    models.refuse_missing(cfg.model, "model")  # a mistyped local path: at once, no hub call, no world joined
    if kind == "distill":
        models.refuse_missing(cfg.kd.teacher, "kd.teacher")
    if rt is None:
        rt = world.init(cfg.backend, timeout_s=cfg.dist_timeout, fallback=cfg.fallback)
        if rt is None:
            return None
    cfg, rt = fit_to_world(cfg, rt)  # fewer processes than planned: same global batch
    policy = precision.resolve(cfg.precision, rt.device)
    factory.refuse_unsupported(rt, policy)  # before the start line, as the other refusals
    compile_policy = compiler.resolve(cfg.train.compile, rt.device.type, rt.backend, cfg.deepspeed)
    task = get_task(cfg.task, cfg.task_options)
    planned_model = cfg.model or (task.default_model if kind == "train" else "from_teacher:")
    settled = settle_config(cfg, planned_model, task, rt.device.type, compile_policy,
                            teacher=cfg.kd.teacher if kind == "distill" else None)
    # the part of the job's record known before data and models load (the rest: JobRecord.built)
    t = settled.train
    per_rank = f"{t.batch_tokens * t.grad_accum} tokens" if t.batch_tokens else f"{t.batch_size * t.grad_accum} rows"
    amount, unit = per_rank.split()
    record = JobRecord(
        config=to_record(settled),
        global_batch=f"{int(amount) * rt.world_size} {unit}", world_size=rt.world_size,
        backend=rt.checkpoint_layout,
        precision=policy.name,
        # a file's sha256 (remembered: a warm start does not read it again) or a hub dataset's fingerprint
        data={split: data_identity(settled.data, task, split) for split in FINGERPRINTED_SPLITS})
    return Plan(settled, rt, kind, task, policy, record, compile_policy, find_batch=cfg.train.batch_size == "auto")


def data_identity(data: DataConfig, task: Task, split: str) -> dict[str, str]:
    """What a split of the job's record is: its file (or hub id, or the sample set) and the
    fingerprint of its rows; a held-out dev split is the training file's with its draw, an absent
    one `skip`."""
    if not data.evaluates(split):
        return {"file": data.dev, "fingerprint": data.dev}
    read_from = data.rows_from(split)
    source = data.source(read_from)
    identity = {"file": source or f"the built-in {task.name} {read_from} set",
                "fingerprint": features.source_identity(task, source, read_from)}
    if read_from != split:
        identity = {key: f"{value} | {data.holdout_name()}" for key, value in identity.items()}
    return identity


def settle_config(cfg: Config, model_spec: str, task: Task, device_type: str,
                  compile_policy: CompilePolicy, teacher: str | None = None) -> SettledConfig:
    """The config with every derived default filled in for this model, task and device (cuda | cpu);
    train.compile from `compile_policy` (compiler.resolve); a distill stage's `teacher` names its
    default output_dir."""
    t = cfg.train
    train = SettledTrain(**{**shallow_fields(t), **device_defaults(t, device_type == "cuda", compile_policy),
                            "lr": t.lr if t.lr is not None else (
                                PRESET_LR if model_spec.startswith("preset:") else task.pretrained_lr),
                            "epochs": t.epochs if t.epochs is not None else task.epochs,
                            "batch_size": AUTO_BATCH if t.batch_size == "auto" else t.batch_size,
                            "group_by_length": t.group_by_length if t.group_by_length is not None
                            else task.group_by_length})
    return SettledConfig(**{**shallow_fields(cfg), "train": train,
                            "output_dir": default_output_dir(cfg, model_spec, teacher)})


def device_defaults(train: TrainConfig, gpu: bool, compile_policy: CompilePolicy) -> dict[str, Any]:
    """The device-dependent defaults (benchmarks/results/train-*.json, compile-*.json), beside the
    compile mode (settled by compiler.resolve): on a GPU 2 loader workers, as a small or medium step
    there is bound by the host's collation; on a CPU none. A compiled job pads lengths to at most 8
    buckets; an eager one pads to the longest row only (on short rows a multiple of 8 added tokens
    and no speed)."""
    multiple = train.pad_to_multiple_of
    if multiple is None:
        multiple = max(8, train.max_length // 64 * 8) if compile_policy.compiled else 1
    workers = train.num_workers if train.num_workers is not None else (2 if gpu else 0)
    return {"compile": compile_policy.mode, "pad_to_multiple_of": multiple, "num_workers": workers}


