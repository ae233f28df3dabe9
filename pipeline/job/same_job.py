"""resume=auto continues the same job, never another: a checkpoint's job record against the job
asked for now (job_record.py), compared before anything heavy is loaded. Comparing only:
reading the records is job_record's, and sharing the answer across ranks the caller's.

What may differ: the keys in SAFE (logging, tracking, checkpoint cadence, workers, timeouts:
nothing the optimization reads) and the split of the global batch into processes, micro-batches
and accumulation steps (the fallback to fewer devices), as long as the global batch stays. Any
other change stops the job in one line naming each key with its old and new value, unless the
user lists it in accept_changes: then the job goes on and its run says so (a tag and a param
per change).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.job_record import JobRecord
from pipeline.layout import OutputDir
from pipeline.runtime.world import resume_refusal

SAFE = ("train.log_every", "train.save_every", "train.keep_checkpoints", "train.num_workers",
        "train.eval_batch_size", "train.max_nonfinite", "train.compile", "train.pad_to_multiple_of", "tracking.*",
        "train.gradient_checkpointing", "train.memory_limit_mb", "infer.*",
        "resume", "accept_changes", "output_dir", "overwrite", "fallback",
        "dist_timeout")
"""Config keys a resumed job may change: none of them changes what is optimized or how."""
COMPARED_ELSEWHERE = ("train.batch_size", "train.grad_accum", "requested_world_size", "backend", "precision", "data.*",
                      "model", "kd.teacher")
"""Config keys compared through what they make: the global batch, the checkpoint layout (torch or
DeepSpeed), the resolved precision, the data's fingerprints, the model's architecture and
tokenizer, the teacher's weights (a file or model moved is the same one)."""
LENGTH_KEYS = ("train.epochs", "train.max_steps")


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        if self.key.startswith("data."):
            return (f"{self.key}: {self.new['file']} changed (fingerprint {_short(self.old['fingerprint'])} -> "
                    f"{_short(self.new['fingerprint'])})")
        if self.key in ("tokenizer", "kd.teacher"):
            return f"{self.key}: changed ({_short(self.old)} -> {_short(self.new)})"
        return f"{self.key}: {_shown(self.old)} -> {_shown(self.new)}"


def changes(old: JobRecord, new: JobRecord) -> list[Change]:
    """What differs between two records, in a stable order: the settings, then what was built."""
    return settings_changes(old, new) + built_changes(old, new)


def settings_changes(old: JobRecord, new: JobRecord) -> list[Change]:
    """What differs in the part of the records known before data and models load."""
    found = [Change(k, old.config.get(k, _UNSET), new.config.get(k, _UNSET))
             for k in sorted(set(old.config) | set(new.config))
             if not _matches(k, SAFE + COMPARED_ELSEWHERE) and old.config.get(k, _UNSET) != new.config.get(k, _UNSET)]
    found += [Change(name, getattr(old, name), getattr(new, name)) for name in ("global_batch", "precision")
              if getattr(old, name) != getattr(new, name)]
    found += [Change(f"data.{split}", old.data[split], new.data[split]) for split in sorted(new.data)
              if split in old.data and old.data[split]["fingerprint"] != new.data[split]["fingerprint"]]
    return found


def built_changes(old: JobRecord, new: JobRecord) -> list[Change]:
    """The tokenizer and teacher, where both records have them (the new one has them once the
    stage is built)."""
    found = []
    for name, key in (("tokenizer", "tokenizer"), ("teacher", "kd.teacher")):
        if getattr(old, name) and getattr(new, name) and getattr(old, name) != getattr(new, name):
            found.append(Change(key, getattr(old, name), getattr(new, name)))
    return found


def check_settings(ckpt: Path, old: JobRecord | None, new: JobRecord, accept: list[str]) -> list[Change]:
    """Before data and models load: the settings' changes the user accepted (to record on the run);
    a UserError naming the checkpoint for a record missing, another backend, a DeepSpeed
    checkpoint on another world size, or a change not accepted."""
    where = f"resume: checkpoint {ckpt}"
    if old is None:
        raise UserError(f"{where}: written by an older version, without the record of its job; "
                        "resume=never overwrite=true starts over, or use another output_dir")
    refusal = resume_refusal(old.backend, old.world_size, new.backend, new.world_size)
    if refusal:
        raise UserError(f"{where}: {refusal}")
    return _accepted(where, settings_changes(old, new), accept)


def check_built(ckpt: Path, old: JobRecord, new: JobRecord, accept: list[str]) -> list[Change]:
    """Once the stage is built: the model must fit the checkpoint's weights (a UserError if not);
    the tokenizer's and teacher's changes the user accepted, or a UserError naming them."""
    where = f"resume: checkpoint {ckpt}"
    if old.architecture and new.architecture and old.architecture != new.architecture:
        raise UserError(f"{where}: the model no longer matches it ({_architecture_change(old, new)}); resume with "
                        "the model it was trained from, or resume=never overwrite=true starts over")
    return _accepted(where, built_changes(old, new), accept)


def _accepted(where: str, found: list[Change], accept: list[str]) -> list[Change]:
    refused = [c for c in found if c.key not in accept]
    if refused:
        keys = ",".join(c.key for c in found)
        raise UserError(f"{where}: trained with other settings: {'; '.join(map(str, refused))}. resume=never "
                        f"overwrite=true starts over; another output_dir starts a new job; accept_changes={keys} "
                        "continues this one anyway (the run is tagged as mixed)")
    return found


def check_finished(out: OutputDir, old: JobRecord | None, new: JobRecord) -> None:
    """A finished job is not continued: asked for more epochs or steps, or with other settings,
    a UserError saying how to go on (nothing for a job finished before job records existed)."""
    found = changes(old, new) if old else []
    if not found:
        return
    longer = [c for c in found if c.key in LENGTH_KEYS]
    if longer and len(longer) == len(found):
        raise UserError(f"resume: {out} holds a finished job ({'; '.join(map(str, longer))}): a finished job is not "
                        f"extended (its learning rate has decayed to zero); to train on from its best model, "
                        f"model={out.best} with another output_dir")
    raise UserError(f"resume: {out} holds a finished job trained with other settings: {'; '.join(map(str, found))}. "
                    "resume=never overwrite=true starts over; another output_dir starts a new job")


_UNSET = object()
"""A key one record has and the other lacks (shown as "(unset)")."""


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def _shown(value: Any) -> str:
    return "(unset)" if value is _UNSET else str(value)


def param_value(value: Any) -> str:
    """A change's side as a param shows it: a data split's fingerprint, else the value."""
    return _short(value["fingerprint"]) if isinstance(value, dict) and "fingerprint" in value else _shown(value)


def _short(fingerprint: str) -> str:
    """A fingerprint as a person compares it: sha256:0123456789ab, a hub fingerprint's last part; a
    held-out dev split's with its draw (job/plan.py data_identity: `SOURCE | holdout:F:SEED`)."""
    source, held, draw = fingerprint.partition(" | ")
    if held:
        return f"{_short(source)} | {draw}"
    if fingerprint.startswith("hub:"):
        return fingerprint.rsplit("|", 1)[-1][:16]
    kind, sep, digest = fingerprint.partition(":")
    return f"{kind}:{digest[:12]}" if sep else fingerprint[:12]


def _architecture_change(old: JobRecord, new: JobRecord) -> str:
    keys = sorted(k for k in set(old.architecture) | set(new.architecture)
                  if old.architecture.get(k) != new.architecture.get(k))
    shown = [f"{k} {_shown(old.architecture.get(k, _UNSET))} -> {_shown(new.architecture.get(k, _UNSET))}" for k in keys
             if k != "parameters"][:3]
    return ", ".join(shown) or "parameter names or shapes differ"
