"""`python -m pipeline study STUDY.yaml [--dry-run] [key=value ...]`: run a matrix of stages.

Every cell of the matrix is one stage (`train` or `distill`) in its own process, started
through its launcher (none, torchrun, deepspeed), logged as a child of the study's one MLflow
parent run, with its outputs in OUTPUT_ROOT/STUDY/CELL. A cell that crashes is recorded (exit
code and last line, on the parent run) and the study goes on; cells that already finished are
skipped, so running a study again resumes it. At the end the comparison report is written.

Study file (YAML):

    name: wikiqa_kd                  # the MLflow experiment; outputs/NAME/CELL, reports/NAME
    config: configs/demo.yaml        # optional base config (relative to the working directory,
                                     # else to the study file)
    overrides: [train.epochs=2]      # every cell; a list of key=value or a mapping
    output_root: outputs             # optional (default outputs)
    report_dir: reports/wikiqa_kd    # optional (default reports/NAME)
    launcher: none                   # none | torchrun | deepspeed, or a mapping:
                                     #   {type: torchrun, nproc: 2, nnodes: 1, rdzv_endpoint: HOST:PORT}
                                     #   {type: deepspeed, nproc: 8, config: ds_configs/zero2.json}
    procedures:                      # name -> stage command, overrides, optional launcher
      teacher:  {command: train, overrides: [model=sentence-transformers/all-MiniLM-L6-v2]}
      kd_fp32:  {command: distill, launcher: {type: torchrun, nproc: 2},
                 overrides: [precision=fp32, model=from_teacher:3, "kd.teacher=${teacher.output_dir}"]}
    matrix:                          # one block, or a list of blocks (their union)
      tasks: [wikiqa]                # each axis is optional: a list of values, or a mapping
      models: [...]                  #   value -> overrides for that value (per-task settings)
      precisions: [fp32, auto]
      procedures: [teacher, kd_fp32] # names from `procedures`; absent = one `train` stage
      seeds: [1, 2]
      overrides: [...]               # this block's cells only

`${PROC.output_dir}` in a cell's overrides is the output directory of the cell of procedure
PROC in the same block with the same task, model, precision and seed; that cell runs first,
and if it failed the dependent cell is recorded as failed without running.

Overrides apply in this order (a later one wins): config file, study overrides, block
overrides, task, model, precision, seed, procedure, launcher (backend=deepspeed ...),
command-line overrides, and last the runner's own (output_dir, tracking.*).

Which report table a cell feeds: the AMP table (FP32 vs AMP per task x model) when its block
has two or more precisions; the KD table (per procedure) when its block has a procedures axis.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.errors import UserError

log = logging.getLogger("pipeline")

STUDY_KEYS = ("name", "description", "config", "overrides", "launcher", "procedures", "matrix", "output_root",
              "report_dir")
AXES = ("tasks", "models", "precisions", "procedures", "seeds")
AXIS_KEY = {"tasks": "task", "models": "model", "precisions": "precision", "seeds": "seed"}
COMMANDS = ("train", "distill")
LAUNCHERS = ("none", "torchrun", "deepspeed")
REF = re.compile(r"\$\{([^}]*)\}")
PARENT_TAG = "study_parent"
CELL_TAG_PREFIX = "cell."  # parent-run tag per cell: the plan and the outcome, as JSON


# ------------------------------------------------------------------ the spec


@dataclass
class Launcher:
    """How a stage process is started: directly, under torchrun, or under the deepspeed launcher."""

    kind: str = "none"
    nproc: int | str = 1
    """Processes per node (torchrun also takes auto, gpu, cpu)."""
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous when nnodes > 1 (default $MASTER_ADDR:29500)."""
    config: str | None = None
    """DeepSpeed JSON config (deepspeed only)."""

    def command(self, stage: str, args: list[str], rdzv_id: str) -> list[str]:
        module = ["-m", "pipeline", stage, *args]
        if self.kind == "torchrun":
            head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.nproc)]
            if self.nnodes == 1:
                head.append("--standalone")
            else:  # this starts the local agent; the other nodes run the same command
                endpoint = self.rdzv_endpoint or f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:29500"
                head += ["--nnodes", str(self.nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                         "--rdzv_id", rdzv_id]
            return head + module
        if self.kind == "deepspeed":
            exe = Path(sys.executable).with_name("deepspeed")  # the launcher beside this interpreter
            head = [str(exe) if exe.exists() else "deepspeed", "--num_gpus", str(self.nproc)]
            if self.nnodes > 1:
                head += ["--num_nodes", str(self.nnodes)]
            return head + ["--module", "pipeline", stage, *args]
        return [sys.executable, *module]

    def overrides(self) -> list[str]:
        if self.kind == "deepspeed":
            return ["backend=deepspeed"] + ([f"deepspeed={self.config}"] if self.config else [])
        return []

    def describe(self) -> str:
        if self.kind == "none":
            return "none"
        nodes = f"x{self.nnodes} nodes" if self.nnodes > 1 else ""
        return f"{self.kind}:{self.nproc}{nodes}"


@dataclass
class Procedure:
    name: str
    command: str = "train"
    overrides: list[tuple[str, str]] = field(default_factory=list)
    """(key=value, where it came from) pairs; the origin names the study-file key in errors."""
    launcher: Launcher | None = None


@dataclass
class Block:
    """One matrix: the product of its axes. An absent axis is None (not varied)."""

    index: int
    axes: dict[str, dict[str, list[tuple[str, str]]] | None]
    """axis -> {value: overrides of that value} (ordered), or None."""
    overrides: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Study:
    name: str
    path: Path
    config: str | None
    overrides: list[tuple[str, str]]
    extra: list[tuple[str, str]]
    """Command-line overrides: applied to every cell after the study file's own."""
    launcher: Launcher
    procedures: dict[str, Procedure]
    blocks: list[Block]
    output_root: Path
    report_dir: Path


@dataclass
class Cell:
    name: str
    procedure: str
    command: str
    launcher: Launcher
    output_dir: Path
    overrides: list[tuple[str, str]]
    values: dict[str, str]
    """The block's axis values of this cell: axis name (tasks, models, ...) -> value."""
    tables: list[str]
    needs: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    """Effective task, model, precision, seed (from the resolved config), for the report."""

    def args(self) -> list[str]:
        return [text for text, _ in self.overrides]


# ------------------------------------------------------------------ loading


def load_study(path: str | Path, extra: list[str] = ()) -> tuple[Study, list[Cell]]:
    """Parse and check a study file; returns the spec and its cells in run order.

    Every problem is a one-line UserError naming the file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"study: {path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    p = _Parser(path)
    study = p.study(raw, list(extra))
    cells = plan(study, p)
    return study, cells


class _Parser:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, reason: str):
        raise UserError(f"{self.path}: {key}: {reason}")

    def study(self, raw, extra: list[str]) -> Study:
        if not isinstance(raw, dict):
            self.fail("(top level)", "must be a mapping of keys")
        for key in raw:
            if key not in STUDY_KEYS:
                self.fail(str(key), f"unknown key (expected one of {', '.join(STUDY_KEYS)})")
        name = raw.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            self.fail("name", "required: a name of letters, digits, '.', '_' or '-' (the MLflow experiment)")
        config = raw.get("config")
        if config is not None:
            if not isinstance(config, str):
                self.fail("config", "expected a path")
            found = next((c for c in (Path(config), self.path.parent / config) if c.is_file()), None)
            if found is None:
                self.fail("config", f"{config}: no such file (relative to the working directory or the study file)")
            config = str(found)
        procedures = {}
        raw_procs = raw.get("procedures") or {}
        if not isinstance(raw_procs, dict):
            self.fail("procedures", "expected a mapping of name -> {command, overrides, launcher}")
        for pname, spec in raw_procs.items():
            procedures[str(pname)] = self.procedure(str(pname), spec)
        matrix = raw.get("matrix")
        if matrix is None:
            matrix = {}
        blocks_raw = matrix if isinstance(matrix, list) else [matrix]
        blocks = [self.block(i, b, procedures, "matrix" if not isinstance(matrix, list) else f"matrix[{i}]")
                  for i, b in enumerate(blocks_raw)]
        if not blocks:
            self.fail("matrix", "must have at least one block")
        for key in ("output_root", "report_dir"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                self.fail(key, "expected a path")
        return Study(
            name=name, path=self.path, config=config,
            overrides=self.overrides(raw.get("overrides"), "overrides"),
            extra=[(self.check_override(a, "command line"), "command line") for a in extra],
            launcher=self.launcher(raw.get("launcher"), "launcher"), procedures=procedures, blocks=blocks,
            output_root=Path(raw.get("output_root") or "outputs"),
            report_dir=Path(raw.get("report_dir") or f"reports/{name}"))

    def procedure(self, name: str, spec) -> Procedure:
        key = f"procedures.{name}"
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            self.fail(key, "expected a mapping with command, overrides, launcher")
        for k in spec:
            if k not in ("command", "overrides", "launcher"):
                self.fail(f"{key}.{k}", "unknown key (expected command, overrides, launcher)")
        command = spec.get("command", "train")
        if command not in COMMANDS:
            self.fail(f"{key}.command", f"{command!r}: must be one of {' | '.join(COMMANDS)}")
        launcher = self.launcher(spec["launcher"], f"{key}.launcher") if "launcher" in spec else None
        return Procedure(name, command, self.overrides(spec.get("overrides"), f"{key}.overrides"), launcher)

    def block(self, index: int, raw, procedures: dict[str, Procedure], key: str) -> Block:
        if not isinstance(raw, dict):
            self.fail(key, "expected a mapping of axes (tasks, models, precisions, procedures, seeds)")
        for k in raw:
            if k not in (*AXES, "overrides"):
                self.fail(f"{key}.{k}", f"unknown key (expected {', '.join(AXES)}, overrides)")
        axes: dict = {}
        for axis in AXES:
            value = raw.get(axis)
            if value is None:
                axes[axis] = None
                continue
            where = f"{key}.{axis}"
            if isinstance(value, list):
                items = {}
                for v in value:
                    if isinstance(v, (dict, list)) or v is None:
                        self.fail(where, f"{v!r}: expected a scalar value")
                    items[str(v)] = []
            elif isinstance(value, dict):
                items = {str(v): self.overrides(o, f"{where}.{v}") for v, o in value.items()}
            else:
                self.fail(where, "expected a list of values or a mapping value -> overrides")
            if not items:
                self.fail(where, "is empty (leave the axis out instead)")
            if axis == "seeds":
                for v in items:
                    if not re.fullmatch(r"-?\d+", v):
                        self.fail(where, f"{v!r}: a seed must be an integer")
            if axis == "procedures":
                for v in items:
                    if v not in procedures:
                        self.fail(where, f"{v!r}: not declared under procedures "
                                         f"(declared: {', '.join(procedures) or 'none'})")
            axes[axis] = items
        return Block(index, axes, self.overrides(raw.get("overrides"), f"{key}.overrides"))

    def launcher(self, raw, key: str) -> Launcher:
        if raw is None or raw == "none":
            return Launcher()
        if isinstance(raw, str):
            raw = {"type": raw}
        if not isinstance(raw, dict):
            self.fail(key, f"expected {' | '.join(LAUNCHERS)} or a mapping with type, nproc, nnodes, config")
        for k in raw:
            if k not in ("type", "nproc", "nnodes", "rdzv_endpoint", "config"):
                self.fail(f"{key}.{k}", "unknown key (expected type, nproc, nnodes, rdzv_endpoint, config)")
        kind = raw.get("type", "none")
        if kind not in LAUNCHERS:
            self.fail(f"{key}.type", f"{kind!r}: must be one of {' | '.join(LAUNCHERS)}")
        nproc = raw.get("nproc", 1)
        if not ((isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1)
                or (kind == "torchrun" and nproc in ("auto", "gpu", "cpu"))):
            self.fail(f"{key}.nproc", f"{nproc!r}: must be an integer >= 1" + (" or auto" if kind == "torchrun" else ""))
        nnodes = raw.get("nnodes", 1)
        if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 1:
            self.fail(f"{key}.nnodes", f"{nnodes!r}: must be an integer >= 1")
        if kind == "none" and (nproc != 1 or nnodes != 1):
            self.fail(key, "nproc and nnodes need a launcher (type: torchrun or deepspeed)")
        config = raw.get("config")
        if config is not None:
            if kind != "deepspeed":
                self.fail(f"{key}.config", "only the deepspeed launcher takes a config")
            if not isinstance(config, str) or not Path(config).is_file():
                self.fail(f"{key}.config", f"{config}: no such file")
        return Launcher(kind, nproc, nnodes, raw.get("rdzv_endpoint"), config)

    def overrides(self, raw, key: str) -> list[tuple[str, str]]:
        if raw is None:
            return []
        if isinstance(raw, dict):
            raw = [f"{k}={_text(v)}" for k, v in raw.items()]
        if not isinstance(raw, list):
            self.fail(key, "expected a list of key=value (or a mapping key: value)")
        return [(self.check_override(item, f"{key}[{i}]"), key) for i, item in enumerate(raw)]

    def check_override(self, item, key: str) -> str:
        if not isinstance(item, str) or "=" not in item or item.startswith("="):
            self.fail(key, f"{item!r}: expected key=value")
        return item


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


# ------------------------------------------------------------------ the plan


def plan(study: Study, parser: _Parser | None = None) -> list[Cell]:
    """The study's cells in run order (a cell after the cells it references)."""
    parser = parser or _Parser(study.path)
    cells: list[Cell] = []
    by_block_values: dict[tuple, Cell] = {}
    for block in study.blocks:
        axes = {a: v for a, v in block.axes.items() if v is not None}
        tables = (["amp"] if len(axes.get("precisions", {})) >= 2 else []) + (["kd"] if "procedures" in axes else [])
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
            overrides += study.extra
            name = _cell_name(values) or proc.name
            if any(c.name == name for c in cells):
                name = f"{name}-{block.index}"
            cell = Cell(name=name, procedure=proc.name, command=proc.command, launcher=launcher,
                        output_dir=study.output_root / study.name / name, overrides=overrides,
                        values=values, tables=tables)
            cells.append(cell)
            by_block_values[(block.index, tuple(sorted(values.items())))] = cell
    for cell in cells:
        _resolve_refs(study, cell, by_block_values, parser)
    ordered = _topological(cells, parser)
    for cell in ordered:
        cell.overrides += _runner_overrides(study, cell)
        cell.plan = _effective(study, cell, parser)
    return ordered


def _block_key(study: Study, block: Block) -> str:
    return "matrix" if len(study.blocks) == 1 else f"matrix[{block.index}]"


def _cell_name(values: dict[str, str]) -> str:
    parts = []
    for axis in ("tasks", "models", "precisions", "procedures", "seeds"):
        if axis in values:
            v = values[axis].rstrip("/").split("/")[-1] if axis == "models" else values[axis]
            parts.append(f"s{v}" if axis == "seeds" else v)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts)).strip("-.")


def _resolve_refs(study: Study, cell: Cell, index: dict, parser: _Parser) -> None:
    """Replace ${PROC.output_dir} with the output directory of PROC's cell in the same block."""
    block = next(i for (i, vals), c in index.items() if c is cell)
    resolved = []
    for text, origin in cell.overrides:
        def sub(m: re.Match) -> str:
            ref = m.group(1)
            proc, _, attr = ref.partition(".")
            if attr != "output_dir":
                parser.fail(origin, f"${{{ref}}}: only ${{PROCEDURE.output_dir}} can be referenced")
            if proc == cell.procedure:
                parser.fail(origin, f"${{{ref}}}: a procedure cannot reference its own output")
            values = {**cell.values, "procedures": proc}
            target = index.get((block, tuple(sorted(values.items()))))
            if target is None:
                parser.fail(origin, f"${{{ref}}}: no cell of procedure {proc!r} in the same matrix block "
                                    f"(add {proc} to its procedures axis)")
            if target.name not in cell.needs:
                cell.needs.append(target.name)
            return str(target.output_dir)

        resolved.append((REF.sub(sub, text), origin))
    cell.overrides = resolved


def _topological(cells: list[Cell], parser: _Parser) -> list[Cell]:
    """Stable order: each cell after the cells it needs, otherwise as declared."""
    done: list[Cell] = []
    names: set[str] = set()
    pending = list(cells)
    while pending:
        ready = [c for c in pending if all(n in names for n in c.needs)]
        if not ready:
            parser.fail("procedures", "the ${PROC.output_dir} references form a cycle: "
                        + ", ".join(c.name for c in pending))
        for c in ready:
            done.append(c)
            names.add(c.name)
        pending = [c for c in pending if c.name not in names]
    return done


def _runner_overrides(study: Study, cell: Cell) -> list[tuple[str, str]]:
    origin = "(the study runner)"
    items = [f"output_dir={cell.output_dir}", f"tracking.experiment={study.name}", f"tracking.run_name={cell.name}",
             f"tracking.tags.study={study.name}", f"tracking.tags.procedure={cell.procedure}",
             f"tracking.tags.cell={cell.name}", f"tracking.tags.report_tables={','.join(cell.tables) or 'none'}"]
    return [(i, origin) for i in items]


def _effective(study: Study, cell: Cell, parser: _Parser) -> dict:
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
                origin = cell.overrides[k - 2][1] if k >= 2 else ("config" if k == 0 else "(the study runner)")
                break
        reason = str(e).removeprefix("config: ")
        raise UserError(f"{study.path}: {origin}: {reason} (cell {cell.name})") from None
    cell.overrides.insert(0, ("resume=auto", "(the study runner)"))
    model = cfg.model
    if model is None:
        from pipeline.tasks import get_task

        model = get_task(cfg.task, cfg.task_options).default_model
    if cfg.model_config:  # e.g. the baseline: the teacher's encoder cut to 3 layers
        model += " (" + ", ".join(f"{k}={v}" for k, v in cfg.model_config.items()) + ")"
    return {"task": cfg.task, "model": model, "precision": cfg.precision, "seed": cfg.seed,
            "procedure": cell.procedure, "command": cell.command, "launcher": cell.launcher.describe(),
            "tables": cell.tables, "needs": cell.needs}


# ------------------------------------------------------------------ running


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline study")
    parser.add_argument("study", help="study file (YAML); see launch/studies/")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every cell (after the study file's)")
    parser.add_argument("--dry-run", action="store_true", help="print the cells and their commands; run nothing")
    opts = parser.parse_intermixed_args(args)  # overrides may come before or after --dry-run
    study, cells = load_study(opts.study, opts.overrides)
    if opts.dry_run:
        return dry_run(study, cells)
    return run_study(study, cells)


def dry_run(study: Study, cells: list[Cell]) -> int:
    print(f"study {study.name}: {len(cells)} cells (experiment {study.name}, outputs in "
          f"{study.output_root / study.name}, report in {study.report_dir})")
    for cell in cells:
        done = " [finished: would skip]" if (cell.output_dir / "metrics.json").is_file() else ""
        print(f"- {cell.name}{done}\n    {shlex.join(cell.launcher.command(cell.command, cell.args(), 'PARENT'))}")
    return 0


def run_study(study: Study, cells: list[Cell]) -> int:
    from pipeline import report
    from pipeline.config import load_config
    from pipeline.tracking import open_experiment, resolve_uri

    base = load_config(study.config, [t for t, _ in study.overrides + study.extra])
    uri = resolve_uri(base.tracking.uri)
    client, experiment_id = open_experiment(uri, study.name)
    parent = open_parent(client, experiment_id, study)
    previous = publish_plan(client, parent, cells)
    log.info("study %s: %d cells; parent MLflow run %s in %s", study.name, len(cells), parent, uri)
    outcomes: dict[str, dict] = {}
    try:
        with _sigterm_stops():
            for i, cell in enumerate(cells, 1):
                outcome = _run_cell(client, experiment_id, study, cell, parent, outcomes, f"[{i}/{len(cells)}]")
                outcomes[cell.name] = outcome
                before = previous.get(cell.name, {}) if outcome.get("skipped") else {}  # its first run's wall time
                client.set_tag(parent, CELL_TAG_PREFIX + cell.name, json.dumps({**before, **cell.plan, **outcome}))
    except BaseException as e:
        client.set_terminated(parent, status="KILLED")
        if isinstance(e, Stopped):
            log.warning("study %s: stopped by SIGTERM; run it again to resume", study.name)
            return 143  # 128 + SIGTERM, as a stage that stopped on TERM
        raise
    failed = [n for n, o in outcomes.items() if o["status"] != "finished"]
    client.log_metric(parent, "study/cells_finished", len(cells) - len(failed))
    client.log_metric(parent, "study/cells_failed", len(failed))
    client.set_terminated(parent, status="FAILED" if failed else "FINISHED")
    out = report.write_report(uri, study.name, study.report_dir)
    log.info("study %s: %d/%d cells finished%s; report in %s", study.name, len(cells) - len(failed), len(cells),
             f" (failed: {', '.join(failed)})" if failed else "", out / "report.md")
    return 1 if failed else 0


def open_parent(client, experiment_id: str, study: Study) -> str:
    """The study's one parent run: reopened when the study runs again (found by tag)."""
    found = client.search_runs([experiment_id], f"tags.{PARENT_TAG} = 'true' and tags.study = '{study.name}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(experiment_id, run_name=study.name,
                            tags={PARENT_TAG: "true", "study": study.name, "study_file": str(study.path)})
    if study.path.is_file():
        client.log_artifact(run.info.run_id, str(study.path))
    return run.info.run_id


def publish_plan(client, parent: str, cells: list[Cell]) -> dict[str, dict]:
    """One tag per cell on the parent run, so the report knows the cells that never produced a run.

    Returns the entries a previous invocation left (cell -> plan and outcome)."""
    from mlflow.entities import RunTag

    existing = client.get_run(parent).data.tags
    names = {c.name for c in cells}
    for key in existing:  # cells no longer in the study file
        if key.startswith(CELL_TAG_PREFIX) and key[len(CELL_TAG_PREFIX):] not in names:
            client.delete_tag(parent, key)
    previous = {c.name: json.loads(existing.get(CELL_TAG_PREFIX + c.name, "{}")) for c in cells}
    tags = [RunTag(CELL_TAG_PREFIX + c.name, json.dumps({"status": "planned", **previous[c.name], **c.plan}))
            for c in cells]
    for i in range(0, len(tags), 100):
        client.log_batch(parent, tags=tags[i : i + 100])
    return previous


def finished_run(client, experiment_id: str, study: Study, cell: Cell) -> str | None:
    runs = client.search_runs([experiment_id], f"tags.study = '{study.name}' and tags.cell = '{cell.name}' "
                              "and attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    return runs[0].info.run_id if runs else None


def _run_cell(client, experiment_id: str, study: Study, cell: Cell, parent: str, outcomes: dict,
              counter: str) -> dict:
    run_id = finished_run(client, experiment_id, study, cell)
    if (cell.output_dir / "metrics.json").is_file() or run_id:
        log.info("%s %s: finished before; skipped", counter, cell.name)
        return {"status": "finished", "exit_code": 0, "run_id": run_id, "skipped": True}
    broken = [n for n in cell.needs if outcomes.get(n, {}).get("status") != "finished"]
    if broken:
        log.warning("%s %s: not run: it needs %s, which failed", counter, cell.name, ", ".join(broken))
        return {"status": "failed", "exit_code": None, "reason": f"needs {', '.join(broken)}, which failed"}
    cmd = cell.launcher.command(cell.command, cell.args() + [f"tracking.parent_run_id={parent}"],
                                f"{study.name}-{cell.name}")
    log_path = study.output_root / study.name / "_logs" / f"{cell.name}.log"
    log.info("%s %s: %s", counter, cell.name, shlex.join(cmd))
    start = time.perf_counter()
    code, last = _execute(cmd, log_path)
    wall = time.perf_counter() - start
    if code == 0:
        run_id = finished_run(client, experiment_id, study, cell)
        log.info("%s %s: finished in %.1fs", counter, cell.name, wall)
        return {"status": "finished", "exit_code": 0, "run_id": run_id, "wall_s": round(wall, 1)}
    log.warning("%s %s: failed with exit code %d after %.1fs: %s (log: %s)", counter, cell.name, code, wall, last,
                log_path)
    return {"status": "failed", "exit_code": code, "reason": last[:300], "wall_s": round(wall, 1)}


def _execute(cmd: list[str], log_path: Path) -> tuple[int, str]:
    """Run a stage, echoing its output and keeping it in log_path; (exit code, last error line)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    last_line = last_error = ""
    with log_path.open("w", encoding="utf-8") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                    errors="replace")
        except OSError as e:  # the launcher itself is missing (deepspeed not installed)
            f.write(f"{e}\n")
            return 127, f"cannot start {cmd[0]}: {e.strerror}"
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                f.write(line)
                if line.strip():
                    last_line = line.strip()
                    if line.startswith("error") or "Error" in line:  # the CLI's one-line error, or a traceback's
                        last_error = last_line
            code = proc.wait()
        except BaseException as e:
            # Ctrl-C reached the stage too (same process group); a SIGTERM of the study is passed
            # on, so the stage checkpoints at its next step and the next invocation resumes it
            if not isinstance(e, KeyboardInterrupt) and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            for line in proc.stdout:  # drain, so the stage never blocks on a full pipe
                sys.stdout.write(line)
                f.write(line)
            proc.wait()
            raise
    return code, last_error or last_line


class Stopped(Exception):
    """The study got SIGTERM (a scheduler's time limit): the running stage was stopped too."""


@contextlib.contextmanager
def _sigterm_stops():
    def stop(signum, frame):
        raise Stopped("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
