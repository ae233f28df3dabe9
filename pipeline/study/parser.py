"""Loading a study file: YAML -> a checked Study and its planned cells.

Every problem is a one-line UserError naming the file and the key.
"""
from __future__ import annotations

import re
from pathlib import Path

from pipeline.config.documents import read_document
from pipeline.job_record import KINDS
from pipeline.study.matrix import plan_cells
from pipeline.study.search_plan import check_space
from pipeline.study.search_spec import parse_search
from pipeline.study.spec import (
    AXES,
    LAUNCHERS,
    POST_STAGE,
    Block,
    Cell,
    Launcher,
    Procedure,
    SlurmSettings,
    Study,
    study_error,
)

STUDY_KEYS = ("name", "description", "config", "overrides", "launcher", "procedures", "matrix", "output_root",
              "report_dir", "slurm", "search")
SLURM_TEXT = ("partition", "time", "account", "qos", "mem", "report_time")
SLURM_COUNTS = ("cpus_per_task", "gpus_per_node")
SLURM = "slurm."
"""A command-line override's prefix for the study's own slurm settings (slurm.partition=gpu), not a cell's key."""


def load_study(path: str | Path, extra: list[str] = (), search: dict | None = None) -> tuple[Study, list[Cell]]:
    """Parse and check a study file; returns the spec and its cells in run order. `search`: the
    command line's search options, laid over the file's `search` block.

    Every problem is a one-line UserError naming the file and the key.
    """
    path = Path(path)
    raw = read_document(path, f"study: {path}")
    study = _study(path, raw, list(extra))
    if isinstance(raw, dict) and (raw.get("search") is not None or search):
        file_search = raw.get("search") or {}
        study.search = parse_search(path, {**file_search, **(search or {})} if isinstance(file_search, dict)
                                    else file_search)
    cells = plan_cells(study)
    if study.search:
        check_space(study, cells)
    return study, cells


def _study(path: Path, raw: object, extra: list[str]) -> Study:
    if not isinstance(raw, dict):
        raise study_error(path, "(top level)", "must be a mapping of keys")
    for key in raw:
        if key not in STUDY_KEYS:
            raise study_error(path, str(key), f"unknown key (expected one of {', '.join(STUDY_KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise study_error(path, "name", "required: a name of letters, digits, '.', '_' or '-' (the MLflow experiment)")
    config = raw.get("config")
    if config is not None:
        if not isinstance(config, str):
            raise study_error(path, "config", "expected a path")
        found = next((c for c in (Path(config), path.parent / config) if c.is_file()), None)
        if found is None:
            raise study_error(path, "config",
                              f"{config}: no such file (relative to the working directory or the study file)")
        config = str(found)
    procedures = {}
    raw_procs = raw.get("procedures") or {}
    if not isinstance(raw_procs, dict):
        raise study_error(path, "procedures", "expected a mapping of name -> {command, overrides, launcher}")
    for pname, spec in raw_procs.items():
        procedures[str(pname)] = _procedure(path, str(pname), spec)
    matrix = raw.get("matrix")
    if matrix is None:
        matrix = {}
    blocks_raw = matrix if isinstance(matrix, list) else [matrix]
    blocks = [_block(path, i, b, procedures, "matrix" if not isinstance(matrix, list) else f"matrix[{i}]")
              for i, b in enumerate(blocks_raw)]
    if not blocks:
        raise study_error(path, "matrix", "must have at least one block")
    for key in ("output_root", "report_dir"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise study_error(path, key, "expected a path")
    plain, scoped, slurm = _command_line(path, extra, procedures)
    return Study(
        name=name, path=path, config=config,
        overrides=_overrides(path, raw.get("overrides"), "overrides"),
        extra=plain, scoped=scoped,
        launcher=_launcher(path, raw.get("launcher"), "launcher"), procedures=procedures, blocks=blocks,
        output_root=Path(raw.get("output_root") or "outputs"),
        report_dir=Path(raw.get("report_dir") or f"reports/{name}"),
        slurm=_slurm(path, raw.get("slurm"), slurm))


def _command_line(path: Path, extra: list[str], procedures: dict[str, Procedure]
                  ) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]], dict[str, object]]:
    """The command line's overrides: key=value for every cell, PROCEDURE:key=value for the cells of
    one procedure (the teacher's model alone, say), applied last; and slurm.KEY=VALUE, the study's
    own slurm settings over its file's (each slurm.extra one more sbatch option)."""
    plain: list[tuple[str, str]] = []
    scoped: dict[str, list[tuple[str, str]]] = {}
    slurm: dict[str, object] = {}
    for item in extra:
        text = _check_override(path, item, "command line")
        key, _, value = text.partition("=")
        if key.startswith(SLURM):
            name = key[len(SLURM):]
            if name == "extra":
                slurm.setdefault("extra", []).append(value)
            else:
                slurm[name] = int(value) if name in SLURM_COUNTS and value.isdigit() else value
            continue
        if ":" not in key:
            plain.append((text, "command line"))
            continue
        procedure, _, override = text.partition(":")
        if procedure not in procedures:
            raise study_error(path, "command line", f"{text}: no procedure {procedure!r} in the study (declared: "
                              f"{', '.join(procedures) or 'none'}); PROCEDURE:key=value changes that procedure's cells")
        scoped.setdefault(procedure, []).append((_check_override(path, override, "command line"),
                                                 f"command line ({procedure})"))
    return plain, scoped, slurm


def _slurm(path: Path, raw: object, command_line: dict[str, object]) -> SlurmSettings:
    """The study file's `slurm` mapping with the command line's slurm.KEY=VALUE over it, checked."""
    if raw is None and not command_line:
        return SlurmSettings()
    known = (*SLURM_TEXT, *SLURM_COUNTS, "extra")
    if raw is not None and not isinstance(raw, dict):
        raise study_error(path, "slurm", f"expected a mapping with {', '.join(known)}")
    in_file = raw or {}
    raw = {**in_file, **command_line}
    if "extra" in command_line and isinstance(in_file.get("extra"), list):
        raw["extra"] = [*in_file["extra"], *command_line["extra"]]
    for k, v in raw.items():
        if k not in known:
            raise study_error(path, f"slurm.{k}", f"unknown key (expected one of {', '.join(known)})")
        if k in SLURM_TEXT and not (isinstance(v, str) and v.strip() and not any(c.isspace() for c in v)):
            # an unquoted 4:00:00 is YAML's sexagesimal integer: the quotes keep it a time
            raise study_error(path, f"slurm.{k}", f"{v!r}: expected one word of text (quote times: \"04:00:00\")")
        if k in SLURM_COUNTS and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise study_error(path, f"slurm.{k}", f"{v!r}: must be an integer >= 0")
    extra = raw.get("extra") or []
    if not isinstance(extra, list) or not all(isinstance(e, str) and e.startswith("-") for e in extra):
        raise study_error(path, "slurm.extra", "expected a list of sbatch options (--constraint=h100)")
    return SlurmSettings(**{k: v for k, v in raw.items() if k != "extra"}, extra=extra)


def _procedure(path: Path, name: str, spec: object) -> Procedure:
    key = f"procedures.{name}"
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise study_error(path, key, "expected a mapping with command, overrides, launcher")
    for k in spec:
        if k not in ("command", "overrides", "launcher", *STEP_OPTIONS):
            raise study_error(path, f"{key}.{k}", "unknown key (expected command, overrides, launcher, "
                                                  f"{', '.join(STEP_OPTIONS)})")
    command = spec.get("command", "train")
    if command not in KINDS:
        raise study_error(path, f"{key}.command", f"{command!r}: must be one of {' | '.join(KINDS)}")
    launcher = _launcher(path, spec["launcher"], f"{key}.launcher") if "launcher" in spec else None
    after = {step: options for step in POST_STAGE
             if step in spec and (options := STEP_OPTIONS[step](path, spec[step], f"{key}.{step}")) is not None}
    return Procedure(name, command, _overrides(path, spec.get("overrides"), f"{key}.overrides"), launcher, after)


EXPORT_FLAGS = {"int8": "--int8", "trim_vocab": "--trim-vocab"}
"""A procedure's export options -> the export command's flags."""


def _export(path: Path, raw: object, key: str) -> list[str] | None:
    """`export: true`, `export: {int8: true, trim_vocab: true}` -> the export command's options
    (it checks what it exported); false -> None."""
    if raw is True or raw == {}:
        return ["--check"]
    if raw is False or raw is None:
        return None
    if not isinstance(raw, dict):
        raise study_error(path, key, "expected true, false or a mapping {int8: true, trim_vocab: true}")
    for k, v in raw.items():
        if k not in EXPORT_FLAGS:
            raise study_error(path, f"{key}.{k}", f"unknown key (expected {' or '.join(EXPORT_FLAGS)})")
        if not isinstance(v, bool):
            raise study_error(path, f"{key}.{k}", f"{v!r}: expected true or false")
    return ["--check", *(flag for k, flag in EXPORT_FLAGS.items() if raw.get(k))]


STEP_OPTIONS = {"export": _export}
"""A procedure's key for each post-stage step (spec.POST_STAGE) -> the reader of its value: the
step's options, None for none."""


def _block(path: Path, index: int, raw: object, procedures: dict[str, Procedure], key: str) -> Block:
    if not isinstance(raw, dict):
        raise study_error(path, key, "expected a mapping of axes (tasks, models, precisions, procedures, seeds)")
    for k in raw:
        if k not in (*AXES, "overrides"):
            raise study_error(path, f"{key}.{k}", f"unknown key (expected {', '.join(AXES)}, overrides)")
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
                    raise study_error(path, where, f"{v!r}: expected a scalar value")
                items[str(v)] = []
        elif isinstance(value, dict):
            items = {str(v): _overrides(path, o, f"{where}.{v}") for v, o in value.items()}
        else:
            raise study_error(path, where, "expected a list of values or a mapping value -> overrides")
        if not items:
            raise study_error(path, where, "is empty (leave the axis out instead)")
        if axis == "seeds":
            for v in items:
                if not re.fullmatch(r"-?\d+", v):
                    raise study_error(path, where, f"{v!r}: a seed must be an integer")
        if axis == "procedures":
            for v in items:
                if v not in procedures:
                    raise study_error(path, where, f"{v!r}: not declared under procedures "
                                     f"(declared: {', '.join(procedures) or 'none'})")
        axes[axis] = items
    return Block(index, axes, _overrides(path, raw.get("overrides"), f"{key}.overrides"))


def _launcher(path: Path, raw: object, key: str) -> Launcher:
    if raw is None or raw == "none":
        return Launcher()
    if isinstance(raw, str):
        raw = {"type": raw}
    if not isinstance(raw, dict):
        raise study_error(path, key, f"expected {' | '.join(LAUNCHERS)} or a mapping with type, nproc, nnodes, config")
    for k in raw:
        if k not in ("type", "nproc", "nnodes", "rdzv_endpoint", "config"):
            raise study_error(path, f"{key}.{k}", "unknown key (expected type, nproc, nnodes, rdzv_endpoint, config)")
    kind = raw.get("type", "none")
    if kind not in LAUNCHERS:
        raise study_error(path, f"{key}.type", f"{kind!r}: must be one of {' | '.join(LAUNCHERS)}")
    nproc = raw.get("nproc", 1)
    if not ((isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1)
            or (kind == "torchrun" and nproc in ("auto", "gpu", "cpu"))):
        or_auto = " or auto" if kind == "torchrun" else ""
        raise study_error(path, f"{key}.nproc", f"{nproc!r}: must be an integer >= 1{or_auto}")
    nnodes = raw.get("nnodes", 1)
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 1:
        raise study_error(path, f"{key}.nnodes", f"{nnodes!r}: must be an integer >= 1")
    if kind == "none" and (nproc != 1 or nnodes != 1):
        raise study_error(path, key, "nproc and nnodes need a launcher (type: torchrun or deepspeed)")
    config = raw.get("config")
    if config is not None:
        if kind != "deepspeed":
            raise study_error(path, f"{key}.config", "only the deepspeed launcher takes a config")
        if not isinstance(config, str) or not Path(config).is_file():
            raise study_error(path, f"{key}.config", f"{config}: no such file")
    return Launcher(kind, nproc, nnodes, raw.get("rdzv_endpoint"), config)


def _overrides(path: Path, raw: object, key: str) -> list[tuple[str, str]]:
    if raw is None:
        return []
    if isinstance(raw, dict):
        raw = [f"{k}={_text(v)}" for k, v in raw.items()]
    if not isinstance(raw, list):
        raise study_error(path, key, "expected a list of key=value (or a mapping key: value)")
    return [(_check_override(path, item, f"{key}[{i}]"), key) for i, item in enumerate(raw)]


def _check_override(path: Path, item: object, key: str) -> str:
    if not isinstance(item, str) or "=" not in item or item.startswith("="):
        raise study_error(path, key, f"{item!r}: expected key=value")
    return item


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
