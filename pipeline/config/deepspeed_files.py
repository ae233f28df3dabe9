"""The DeepSpeed JSON a `deepspeed` value names: a file, else one of the configs shipped inside the
package (pipeline/ds_configs/, read with importlib.resources, so a wheel install finds them from any
directory). Only names are resolved here; reading and checking a config is the DeepSpeed backend's."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

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
