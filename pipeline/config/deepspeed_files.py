"""The DeepSpeed JSON a `deepspeed` value names: a file, else one of the configs shipped inside the
package (pipeline/ds_configs/, read with importlib.resources, so a wheel install finds them from any
directory); read, its "auto" values filled from the pipeline's config, and what cannot run refused.
What depends on the model (ZeRO's bucket sizes) and starting the engine are the DeepSpeed backend's."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.config.documents import read_document
from pipeline.config.precision_modes import MODES
from pipeline.errors import UserError

DEFAULT = "zero2.json"
"""The config of a DeepSpeed job that names none."""


def shipped() -> list[str]:
    """The file names of the shipped configs (zero0.json ... zero3.json, zero2_offload.json)."""
    return sorted(p.name for p in resources.files("pipeline").joinpath("ds_configs").iterdir()
                  if p.name.endswith(".json"))


def ds_config_file(value: str | None) -> Path | None:
    """The file `value` names: an existing path as given; else a shipped config by its name, with or
    without `.json` and the checkout's `ds_configs/` prefix (`zero3`, `zero3.json`,
    `ds_configs/zero3.json`); unset: the default. None when it names nothing."""
    if value and Path(value).is_file():
        return Path(value)
    name = Path(value or DEFAULT)
    if name.parent not in (Path("."), Path("ds_configs")):
        return None
    file = name.name if name.suffix == ".json" else f"{name.name}.json"
    found = resources.files("pipeline").joinpath("ds_configs", file)
    return Path(str(found)) if found.is_file() else None


def zero_stage_of(deepspeed_path: str | None) -> int:
    """The ZeRO stage the DeepSpeed config asks for (the backend checks the rest of it)."""
    zero_stage = load_ds_config(deepspeed_path).get("zero_optimization", {}).get("stage", 0)
    return zero_stage if isinstance(zero_stage, int) else 0


def load_ds_config(path: str | None) -> dict:
    """The config `path` names (a file, or a shipped config by name; unset: zero2.json)."""
    p = ds_config_file(path)
    if p is None:
        raise UserError(f"config: deepspeed={path}: no such file, nor a shipped config")
    cfg = read_document(p, f"config: deepspeed={p}", "JSON")
    if not isinstance(cfg, dict):
        raise UserError(f"config: deepspeed={p}: the top level must be an object")
    return cfg


def resolve_ds_config(raw: dict, train: Any, precision: str, world_size: int, source: str) -> dict:
    """Fill "auto" values from the pipeline config's `train` section (schema.TrainConfig, which
    imports this module) and the precision mode's DeepSpeed blocks; refuse disagreements."""
    cfg = json.loads(json.dumps(raw))  # deep copy

    def fill(block: dict, key: str, value: bool | int | float | str, ours: str, label: str | None = None) -> None:
        if block.get(key, "auto") == "auto":
            block[key] = value
        elif block[key] != value:
            theirs = f"{label or key}={json.dumps(block[key])}"
            mine = ours if label else f"{ours}={value}"
            raise UserError(f"config: {source} sets {theirs} but {mine}; "
                            f"make them agree or write \"auto\" in the DeepSpeed config")

    fill(cfg, "train_micro_batch_size_per_gpu", train.batch_size, "train.batch_size")
    fill(cfg, "gradient_accumulation_steps", train.grad_accum, "train.grad_accum")
    fill(cfg, "train_batch_size", train.batch_size * train.grad_accum * world_size,
         "train.batch_size x train.grad_accum x world size")
    fill(cfg, "gradient_clipping", train.max_grad_norm, "train.max_grad_norm")
    mode = MODES[precision]
    for block, settings in (mode.deepspeed or {}).items():
        for key, value in settings.items():
            label = f"{block}.{key}"
            why = mode.deepspeed_why.get(label)
            fill(cfg.setdefault(block, {}), key, value, f"precision={precision}" + (f" {why}" if why else ""),
                 label=label)
    if "optimizer" in cfg:
        params = cfg["optimizer"].setdefault("params", {})
        fill(params, "lr", train.lr, "train.lr")
        fill(params, "weight_decay", train.weight_decay, "train.weight_decay")
    if "scheduler" in cfg:
        raise UserError(f"config: {source}: remove the scheduler block; the pipeline's linear warm-up/decay "
                        "schedule is used with every backend")
    cfg["managed_gradient_accumulation"] = False
    return cfg


def refuse_fp16_on_cpu(precision: str, device_type: str) -> None:
    """DeepSpeed trains no fp16 on its CPU accelerator, whatever the CPU's own fp16 kernels."""
    if device_type == "cpu":
        raise UserError(f"precision={precision} with backend=deepspeed: DeepSpeed's CPU accelerator has no fp16 "
                        "training; use bf16 or fp32")


def check_supported(ds_cfg: dict, precision: str, device_type: str, source: str) -> int:
    """Combinations that cannot work, refused at start instead of deep inside DeepSpeed; returns the
    ZeRO stage."""
    zero_stage = ds_cfg.get("zero_optimization", {}).get("stage", 0)
    if ds_cfg.get("fp16", {}).get("enabled") is True:
        refuse_fp16_on_cpu(precision, device_type)
    if zero_stage not in (0, 1, 2, 3):
        raise UserError(f"config: {source}: zero_optimization.stage={zero_stage}: must be 0, 1, 2 or 3")
    return zero_stage
