"""What this machine lacks for a study's cells, found without running one: a data file that is not
here, a hub dataset or model that is neither on this machine nor in the Hugging Face cache, and a
precision this device refuses (runtime/precision.py's own rule, the one the stage applies) or one
that needs CUDA to mean anything (tf32). The hub is never called: its cache and HF_HUB_OFFLINE are
all that is read.

A cell lacking one of these fails, except for tf32 without CUDA, which runs as plain fp32. Each
want is grouped with the cells it concerns, named compactly: "every cell", the cells of the axis
values they alone share (precision fp16), else the first few names.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pipeline.config import Config
from pipeline.study.spec import AXIS_KEY, Cell

if TYPE_CHECKING:
    import torch

DATA_FILE = "data files not here"
SHOWN = 3
"""Cell names listed before "and N more"."""


class Want(NamedTuple):
    what: str
    """What the machine lacks, in words: the line's head."""
    item: str
    """Which one (a file, a hub id) or why (the device's refusal)."""
    fails: bool = True
    """The cell fails without it (else it runs, otherwise than it says)."""


def this_device() -> torch.device:
    """Where this machine's stages would run: a GPU where CUDA has one, else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.device_count()} CUDA GPU(s), {torch.cuda.get_device_name(device)}"
    return "a CPU, no CUDA"


def wants(cfg: Config, kind: str, device: torch.device) -> list[Want]:
    """What this machine lacks for one cell's config; empty when it has it all."""
    from pipeline.tasks import get_task

    out: list[Want] = []
    for split in ("train", "dev", "test"):
        source = cfg.data.source(split) if cfg.data.reads(split) else None
        if source is None:  # not read, or the built-in sample set
            continue
        if source.startswith("hub:"):
            ident = source.removeprefix("hub:").split(":")[0]
            if not hub_cached(ident, "dataset"):
                out.append(Want(_hub("datasets"), ident))
        elif not Path(source).is_file():
            out.append(Want(DATA_FILE, source))
    models = [cfg.model or get_task(cfg.task, cfg.task_options).default_model]
    if kind == "distill" and cfg.kd.teacher:
        models.append(cfg.kd.teacher)
    out += [Want(_hub("models"), spec) for spec in models if needs_hub(spec) and not hub_cached(spec, "model")]
    out += _precision(cfg.precision, device)
    return list(dict.fromkeys(out))


def needs_hub(spec: str) -> bool:
    """A model named by its hub id: not a preset, a teacher's layers, a packaged copy or a local path."""
    from pipeline.models import looks_local, offline_copy

    return not spec.startswith(("preset:", "from_teacher:")) and offline_copy(spec) is None and not looks_local(spec)


def hub_cached(repo_id: str, repo_type: str) -> bool:
    """Whether the Hugging Face cache holds the repository (a model's config.json; any snapshot of a
    dataset, or the datasets library's own copy), read from disk alone."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name

    if repo_type == "model":
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    snapshots = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type) / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    import datasets

    return (Path(datasets.config.HF_DATASETS_CACHE) / repo_id.replace("/", "___")).is_dir()


def _hub(what: str) -> str:
    from huggingface_hub import constants

    offline = "; HF_HUB_OFFLINE is set, so no download" if constants.HF_HUB_OFFLINE else ""
    return f"the Hugging Face hub, for {what} not in its cache here{offline}"


def _precision(name: str, device: torch.device) -> list[Want]:
    from pipeline.config.precision_modes import MODES
    from pipeline.runtime.precision import refusal

    mode = MODES.get(name)
    if mode is None:  # auto: the device picks what it runs
        return []
    why = refusal(mode, device)
    if why:
        return [Want(f"a device that runs precision={name}", why)]
    if mode.tf32 and device.type != "cuda":
        return [Want(f"a CUDA GPU for precision={name}", "TF32 matmuls are an Ampere or newer GPU's: here these cells "
                     "compute in plain fp32", fails=False)]
    return []


ORDER = (DATA_FILE, "the Hugging Face hub, for datasets", "the Hugging Face hub, for models")
"""The lines' order: data, then models, then devices."""


def lacking(cells: list[tuple[Cell, list[Want]]], device: torch.device) -> list[str]:
    """The lines that say what this machine lacks, per want and the cells it concerns."""
    here = describe_device(device)
    concerned = [cell for cell, found in cells if found]
    if not concerned:
        return [f"This machine ({here}) has what every cell asks for: data, models, precision."]
    by_want: dict[Want, list[str]] = {}
    for cell, found in cells:
        for want in found:
            by_want.setdefault(want, []).append(cell.name)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (what, its cells) -> the items
    for want in sorted(by_want, key=lambda w: next((i for i, o in enumerate(ORDER) if w.what.startswith(o)),
                                                   len(ORDER))):
        grouped.setdefault((want.what, tuple(by_want[want])), []).append(want.item)
    everyone = [cell for cell, _ in cells]
    failing = sum(any(w.fails for w in found) for _, found in cells)
    lines = [f"This machine ({here}) lacks what {len(concerned)} of the {len(everyone)} cells ask for; "
             + (f"{failing} of them would fail:" if failing else "they run, as each line says:")]
    for (what, names), items in grouped.items():
        lines.append(f"- {what}: {', '.join(items)} ({which([c for c in everyone if c.name in names], everyone)})")
    return lines


def which(affected: list[Cell], cells: list[Cell]) -> str:
    """The affected cells in a few words: every cell, the cells of the axis values they alone share
    (values every cell has left out), or their first names."""
    if len(affected) == len(cells):
        return f"every cell, {len(cells)}"
    shared = {a: v for a, v in affected[0].values.items() if all(c.values.get(a) == v for c in affected)
              and not all(c.values.get(a) == v for c in cells)}
    alike = [c for c in cells if shared and all(c.values.get(a) == v for a, v in shared.items())]
    if len(alike) == len(affected):
        return f"the {len(affected)} cells with " + ", ".join(f"{AXIS_KEY.get(a, a.rstrip('s'))} {v}"
                                                             for a, v in shared.items())
    more = f" and {len(affected) - SHOWN} more" if len(affected) > SHOWN else ""
    return f"{len(affected)} cell(s): {', '.join(c.name for c in affected[:SHOWN])}{more}"
