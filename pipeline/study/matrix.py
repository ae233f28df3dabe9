"""Planning a study: its cells, their `${PROC.output_dir}` references, run order and effective config."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import re

from pipeline.config.precision_modes import AMP, REFERENCE, report_side
from pipeline.errors import UserError
from pipeline.names import TAG_CELL, TAG_PROCEDURE, TAG_REPORT_TABLES, TAG_STUDY
from pipeline.study.spec import AXES, AXIS_KEY, Block, Cell, Procedure, Study, study_error

REF = re.compile(r"\$\{([^}]*)\}")
RUNNER = "(the study runner)"
"""The origin of the overrides the runner adds itself."""

log = logging.getLogger("pipeline")


def plan_cells(study: Study) -> list[Cell]:
    """The study's cells in run order (a cell after the cells it references)."""
    cells: list[Cell] = []
    by_block_values: dict[tuple, Cell] = {}
    for block in study.blocks:
        axes = {a: v for a, v in block.axes.items() if v is not None}
        tables = _tables(study, axes)
        for combo in itertools.product(*(list(v.items()) for v in axes.values())):
            values = {axis: value for axis, (value, _) in zip(axes, combo)}
            proc = study.procedures[values["procedures"]] if "procedures" in values else Procedure("train")
            launcher = proc.launcher or study.launcher
            overrides = list(study.overrides) + list(block.overrides)
            for axis in ("tasks", "models", "precisions", "seeds"):
                if axis in values:
                    overrides.append((f"{AXIS_KEY[axis]}={values[axis]}", f"{_block_key(study, block)}.{axis}"))
                    overrides += axes[axis][values[axis]]
            overrides += proc.overrides + (axes["procedures"][proc.name] if "procedures" in axes else [])
            overrides += [(o, f"procedures.{proc.name}.launcher") for o in launcher.overrides()]
            overrides += study.extra + study.scoped.get(proc.name, [])
            name = _cell_name(values) or proc.name
            if any(c.name == name for c in cells):
                name = f"{name}-{block.index}"
            cell = Cell(name=name, procedure=proc.name, kind=proc.kind, launcher=launcher,
                        output_dir=study.output_root / study.name / name, overrides=overrides,
                        values=values, tables=tables, after=dict(proc.after))
            cells.append(cell)
            by_block_values[(block.index, tuple(sorted(values.items())))] = cell
    for cell in cells:
        _resolve_refs(study, cell, by_block_values)
    ordered = _topological(study, cells)
    for cell in ordered:
        cell.overrides += runner_overrides(study, cell)
        cell.plan = _effective(study, cell)
        if cell.plan["memory_limit_mb"] is not None:  # a rung of the memory ceiling, no AMP pair or KD procedure
            _retable(cell, ["ceiling"])
    return ordered


def _tables(study: Study, axes: dict) -> list[str]:
    """The report tables a block's cells feed: the AMP table where its precisions put runs on both
    of its sides (fp32 and one compared with it), the KD table where a procedure distills."""
    sides = {report_side(p) for p in axes.get("precisions", {})}
    distills = any(study.procedures[p].kind == "distill" for p in axes.get("procedures", {}))
    return (["amp"] if {AMP, REFERENCE} <= sides else []) + (["kd"] if distills else [])


def _retable(cell: Cell, tables: list[str]) -> None:
    """The cell's tables replaced, in its plan and in the tag its run carries."""
    tag = f"tracking.tags.{TAG_REPORT_TABLES}="
    cell.tables = tables
    cell.plan["tables"] = tables
    cell.overrides = [(f"{tag}{','.join(tables)}" if text.startswith(tag) else text, origin)
                      for text, origin in cell.overrides]


def _block_key(study: Study, block: Block) -> str:
    return "matrix" if len(study.blocks) == 1 else f"matrix[{block.index}]"


def _cell_name(values: dict[str, str]) -> str:
    parts = []
    for axis in AXES:
        if axis in values:
            v = values[axis].rstrip("/").split("/")[-1] if axis == "models" else values[axis]
            parts.append(f"s{v}" if axis == "seeds" else v)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts)).strip("-.")


def _resolve_refs(study: Study, cell: Cell, index: dict) -> None:
    """Replace ${PROC.output_dir} with the output directory of PROC's cell in the same block."""
    block = next(i for (i, vals), c in index.items() if c is cell)
    resolved = []
    for text, origin in cell.overrides:
        paths = {}
        for ref in REF.findall(text):
            target = _ref_target(study, cell, index, block, ref, origin)
            if target.name not in cell.needs:
                cell.needs.append(target.name)
            paths[ref] = str(target.output_dir)
        resolved.append((_substitute(text, paths), origin))
    cell.overrides = resolved


def _substitute(text: str, paths: dict[str, str]) -> str:
    """`text` with each ${ref} replaced by paths[ref], in one pass."""
    return REF.sub(lambda m: paths[m.group(1)], text)


def _ref_target(study: Study, cell: Cell, index: dict, block: int, ref: str, origin: str) -> Cell:
    """The cell that `${ref}` in one of `cell`'s overrides (from `origin`) names."""
    proc, _, attr = ref.partition(".")
    if attr != "output_dir":
        raise study_error(study.path, origin, f"${{{ref}}}: only ${{PROCEDURE.output_dir}} can be referenced")
    if proc == cell.procedure:
        raise study_error(study.path, origin, f"${{{ref}}}: a procedure cannot reference its own output")
    target = index.get((block, tuple(sorted({**cell.values, "procedures": proc}.items()))))
    if target is None:
        raise study_error(study.path, origin, f"${{{ref}}}: no cell of procedure {proc!r} in the same matrix block "
                                              f"(add {proc} to its procedures axis)")
    return target


def _topological(study: Study, cells: list[Cell]) -> list[Cell]:
    """Stable order: each cell after the cells it needs, otherwise as declared."""
    done: list[Cell] = []
    names: set[str] = set()
    pending = list(cells)
    while pending:
        ready = [c for c in pending if all(n in names for n in c.needs)]
        if not ready:
            raise study_error(study.path, "procedures", "the ${PROC.output_dir} references form a cycle: "
                              + ", ".join(c.name for c in pending))
        for c in ready:
            done.append(c)
            names.add(c.name)
        pending = [c for c in pending if c.name not in names]
    return done


def runner_overrides(study: Study, cell: Cell) -> list[tuple[str, str]]:
    """Where the stage writes and how its MLflow run is named and tagged (the report reads the tags)."""
    items = [f"output_dir={cell.output_dir}", f"tracking.experiment={study.name}", f"tracking.run_name={cell.name}",
             f"tracking.tags.{TAG_STUDY}={study.name}", f"tracking.tags.{TAG_PROCEDURE}={cell.procedure}",
             f"tracking.tags.{TAG_CELL}={cell.name}",
             f"tracking.tags.{TAG_REPORT_TABLES}={','.join(cell.tables) or 'none'}"]
    return [(i, RUNNER) for i in items]


def _effective(study: Study, cell: Cell) -> dict:
    """Validate the cell's config the way the stage will; returns the plan entry for the report."""
    from pipeline.config import load_config

    args = ["resume=auto", *cell.args()]  # a re-run continues a crashed cell from its checkpoint
    try:
        cfg = load_config(study.config, args)
    except UserError as e:
        # find the override that breaks it: the first prefix that fails ends with it
        origin = "config"
        for k in range(len(args) + 1):
            try:
                load_config(study.config, args[:k])
            except UserError:
                origin = cell.overrides[k - 2][1] if k >= 2 else ("config" if k == 0 else RUNNER)
                break
        reason = str(e).removeprefix("config: ")
        raise study_error(study.path, origin, f"{reason} (cell {cell.name})") from None
    cell.overrides.insert(0, ("resume=auto", RUNNER))
    asked = _fit_to_devices(study, cell, cfg.fallback, cfg.requested_world_size)
    model = cfg.model
    if model is None:
        from pipeline.tasks import get_task

        model = get_task(cfg.task, cfg.task_options).default_model
    if cfg.model_config:  # e.g. the baseline: the teacher's encoder cut to 3 layers
        model += " (" + ", ".join(f"{k}={v}" for k, v in cfg.model_config.items()) + ")"
    return {"task": cfg.task, "model": model, "precision": cfg.precision, "seed": cfg.seed,
            "procedure": cell.procedure, "command": cell.kind, "batch_size": cfg.train.batch_size,
            "grad_accum": cfg.train.grad_accum, "memory_limit_mb": cfg.train.memory_limit_mb,
            "launcher": cell.launcher.describe() + (f" (fallback: asked {asked})" if asked else ""),
            "tables": cell.tables, "needs": cell.needs}


def _fit_to_devices(study: Study, cell: Cell, fallback: bool, requested: int) -> str | None:
    """A cell asking for more processes per node than there are devices runs one per device, told
    the world size it was planned for (the stage keeps the global batch with grad_accum); with
    fallback=false the study is refused. Returns what the cell asked for, if it was cut."""
    from pipeline.runtime.world import devices_per_node

    launcher = cell.launcher
    devices = devices_per_node()
    if launcher.kind == "none" or not isinstance(launcher.nproc, int) or devices is None or launcher.nproc <= devices:
        return None
    if not fallback:
        own = cell.procedure in study.procedures and study.procedures[cell.procedure].launcher is not None
        raise study_error(study.path, f"procedures.{cell.procedure}.launcher" if own else "launcher",
                          f"nproc={launcher.nproc} but {devices} device(s) visible and fallback=false "
                          f"(cell {cell.name})")
    asked = launcher.describe()
    cell.launcher = dataclasses.replace(launcher, nproc=devices)
    if not requested:
        cell.overrides.append((f"requested_world_size={launcher.nproc * launcher.nnodes}", RUNNER))
    log.warning("study %s: cell %s asks for %s, %d device(s) per node visible: it runs %s with the same global "
                "batch (fallback)", study.name, cell.name, asked, devices, cell.launcher.describe())
    return asked
