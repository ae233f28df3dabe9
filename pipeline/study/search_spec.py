"""A study's `search:` block (or its command-line options): the space, objective, sampler, pruner,
trial count and time budget of a hyperparameter search, checked, and turned into Optuna's objects.

    search:
      space:                                # config key -> distribution (any key, kd.* included)
        train.lr: {log_uniform: [1.0e-5, 1.0e-3]}
        train.batch_size: {categorical: [16, 32, 64]}
        kd.temperature: {uniform: [1.0, 8.0]}
        train.epochs: {int: [2, 6]}         # or the text form: "log_uniform:1e-5:1e-3", "categorical:16,32"
      objective: eval/main                  # default: the task's dev main metric; any metric the task
                                            #   scores (eval/NAME, test/NAME) or the job logs (perf/...)
      direction: maximize                   # or minimize (eval/loss ...)
      sampler: tpe                          # tpe | random | cmaes | qmc | grid, or {type: tpe, seed: 0, ...}
                                            #   (grid: {type: grid, search_space: {KEY: [values]}})
      pruner: median                        # median | percentile | hyperband | successive_halving | none,
                                            #   or {type: median, n_startup_trials: 3, n_warmup_steps: 1}
      trials: 20                            # per searched cell (task x model x precision x procedure)
      timeout_s: 7200                       # optional: no trial is asked after this many seconds
      storage: sqlite:///optuna.db          # optional: default OUTPUT_ROOT/NAME/optuna.db
      procedures: [kd_fp32]                 # optional: the procedures searched (default: those no
                                            #   other cell needs; the others run first, as cells)
      champion: bangla                      # optional: the best configuration's re-runs register their
                                            #   models as NAME-GROUP (bangla-sentiment); the alias
                                            #   `champion` moves to it only if its mean beats the
                                            #   champion's beyond the seed spread (study/champion.py)

Sampler and pruner options are the Optuna classes' own keyword arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import UserError
from pipeline.study.spec import study_error

DISTRIBUTIONS = ("log_uniform", "uniform", "int", "log_int", "categorical")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "qmc": "QMCSampler",
            "grid": "GridSampler"}
PRUNERS = {"median": "MedianPruner", "percentile": "PercentilePruner", "hyperband": "HyperbandPruner",
           "successive_halving": "SuccessiveHalvingPruner", "none": "NopPruner"}
SEARCH_KEYS = ("space", "objective", "direction", "sampler", "pruner", "trials", "timeout_s", "storage", "procedures",
               "champion")
DIRECTIONS = {"max": "maximize", "min": "minimize"}
"""--objective METRIC:WAY -> search.direction."""
DEFAULT_OBJECTIVE = "eval/main"
"""The task's dev main metric, as every job logs it at each evaluation and in metrics.json."""


@dataclass(frozen=True)
class Dimension:
    key: str
    """The config key it sets (train.lr, kd.alpha ...): also the Optuna parameter's name."""
    kind: str
    values: tuple
    """(low, high) for the numeric kinds; the choices for categorical."""

    def suggest(self, trial) -> object:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, list(self.values))
        low, high = self.values
        if self.kind in ("int", "log_int"):
            return trial.suggest_int(self.key, int(low), int(high), log=self.kind == "log_int")
        return trial.suggest_float(self.key, float(low), float(high), log=self.kind == "log_uniform")

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"categorical {{{', '.join(map(str, self.values))}}}"
        return f"{self.kind} [{self.values[0]}, {self.values[1]}]"


@dataclass(frozen=True)
class Search:
    space: list[Dimension]
    objective: str = DEFAULT_OBJECTIVE
    direction: str = "maximize"
    sampler: dict = field(default_factory=lambda: {"type": "tpe"})
    pruner: dict = field(default_factory=lambda: {"type": "median"})
    trials: int = 20
    timeout_s: float | None = None
    storage: str | None = None
    procedures: list[str] | None = None
    champion: str | None = None

    def make_sampler(self):
        import optuna

        return _build(optuna.samplers, SAMPLERS, self.sampler, "search.sampler")

    def make_pruner(self):
        import optuna

        return _build(optuna.pruners, PRUNERS, self.pruner, "search.pruner")


def _build(module, names: dict[str, str], spec: dict, key: str):
    options = {k: v for k, v in spec.items() if k != "type"}
    try:
        return getattr(module, names[spec["type"]])(**options)
    except (TypeError, ValueError) as e:
        raise UserError(f"{key}: {spec['type']}: {e}") from None


def parse_search(path: Path, raw: object) -> Search | None:
    """The `search` mapping (the study file's, with the command line's options over it), checked."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise study_error(path, "search", f"expected a mapping with {', '.join(SEARCH_KEYS)}")
    for k in raw:
        if k not in SEARCH_KEYS:
            raise study_error(path, f"search.{k}", f"unknown key (expected one of {', '.join(SEARCH_KEYS)})")
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise study_error(path, "search.space", "required: a mapping config key -> distribution "
                                                "({log_uniform: [1e-5, 1e-3]}, {categorical: [16, 32]} ...)")
    dims = [_dimension(path, str(k), v) for k, v in space.items()]
    objective = raw.get("objective", DEFAULT_OBJECTIVE)
    if not isinstance(objective, str) or not objective.strip():
        raise study_error(path, "search.objective", "expected a metric's name (eval/main, eval/f1, test/map ...)")
    if ":" in objective:
        raise study_error(path, "search.objective", f"{objective!r}: a metric's name holds no colon; the way is "
                                                    "search.direction (maximize or minimize)")
    direction = raw.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise study_error(path, "search.direction", f"{direction!r}: must be maximize or minimize")
    trials = raw.get("trials", 20)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise study_error(path, "search.trials", f"{trials!r}: must be an integer >= 1")
    timeout = raw.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise study_error(path, "search.timeout_s", f"{timeout!r}: must be a number of seconds > 0")
    storage = raw.get("storage")
    if storage is not None and not (isinstance(storage, str) and "://" in storage):
        raise study_error(path, "search.storage", f"{storage!r}: expected a database URL (sqlite:///PATH, "
                                                  "postgresql://...)")
    procedures = raw.get("procedures")
    if procedures is not None and not (isinstance(procedures, list) and procedures
                                       and all(isinstance(p, str) for p in procedures)):
        raise study_error(path, "search.procedures", "expected a list of procedure names")
    champion = raw.get("champion")
    if champion is not None and not (isinstance(champion, str) and champion.strip()):
        raise study_error(path, "search.champion", f"{champion!r}: expected a registered model's name")
    search = Search(dims, objective.strip(), direction,
                    _choice(path, raw.get("sampler", "tpe"), SAMPLERS, "sampler"),
                    _choice(path, raw.get("pruner", "median"), PRUNERS, "pruner"), trials,
                    float(timeout) if timeout is not None else None, storage, procedures, champion)
    for key, make in (("sampler", search.make_sampler), ("pruner", search.make_pruner)):
        try:  # its options are the Optuna class's: checked by building it
            make()
        except UserError as e:
            raise study_error(path, f"search.{key}", str(e).removeprefix(f"search.{key}: ")) from None
    return search


def _choice(path: Path, raw: object, names: dict[str, str], key: str) -> dict:
    spec = {"type": raw} if isinstance(raw, str) or raw is None else raw
    if isinstance(spec, dict) and spec.get("type") is None:  # `pruner: null`: none; `sampler: null`: tpe
        spec = {**spec, "type": "none" if key == "pruner" else "tpe"}
    if not isinstance(spec, dict) or spec["type"] not in names:
        raise study_error(path, f"search.{key}", f"{raw!r}: expected one of {' | '.join(names)}, or a mapping "
                                                 "{type: NAME, OPTION: VALUE ...}")
    return dict(spec)


def _dimension(path: Path, key: str, raw: object) -> Dimension:
    where = f"search.space.{key}"
    if isinstance(raw, str):  # the text form: KIND:LOW:HIGH or categorical:A,B,C
        kind, _, rest = raw.partition(":")
        values: object = rest.split(",") if kind == "categorical" else rest.split(":")
        values = [_scalar(v) for v in values] if rest else []
    elif isinstance(raw, dict) and len(raw) == 1:
        ((kind, values),) = raw.items()
    else:
        raise study_error(path, where, f"{raw!r}: expected one of {', '.join(DISTRIBUTIONS)} as {{KIND: [...]}} or "
                                       "KIND:LOW:HIGH")
    if kind not in DISTRIBUTIONS:
        raise study_error(path, where, f"{kind!r}: expected one of {', '.join(DISTRIBUTIONS)}")
    if not isinstance(values, list) or not values:
        raise study_error(path, where, f"{kind}: expected a list of values")
    if kind == "categorical":
        if not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise study_error(path, where, "categorical: the choices must be scalars")
        return Dimension(key, kind, tuple(values))
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if len(values) != 2 or not numbers or not values[0] < values[1]:
        raise study_error(path, where, f"{kind}: expected [LOW, HIGH] with LOW < HIGH, got {values!r}")
    if kind in ("int", "log_int") and not all(float(v).is_integer() for v in values):
        raise study_error(path, where, f"{kind}: the bounds must be integers")
    if kind.startswith("log") and values[0] <= 0:
        raise study_error(path, where, f"{kind}: the low bound must be > 0")
    return Dimension(key, kind, tuple(values))


def _scalar(text: str) -> object:
    """'1e-5' -> 1e-05, '32' -> 32, 'adamw' -> 'adamw' (YAML's own reading of a scalar)."""
    import yaml

    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 1e-5 (no dot) as text
        except ValueError:
            return value
    return value


def from_options(space: list[str], trials: int | None, objective: str | None, pruner: str | None,
                 sampler: str | None, timeout_s: float | None, storage: str | None) -> dict:
    """The command line's search options as a `search` mapping (laid over the study file's)."""
    out: dict = {}
    if space:
        out["space"] = dict(item.partition("=")[::2] for item in space)
    if objective:  # METRIC or METRIC:max|min; no metric name holds a colon
        name, colon, way = objective.rpartition(":")
        if not colon:
            name, way = objective, ""
        elif way not in DIRECTIONS:
            raise UserError(f"study: --objective {objective}: {way!r} is no direction: expected METRIC, "
                            f"METRIC:max or METRIC:min (eval/main:max, eval/loss:min)")
        out["objective"] = name
        if way:
            out["direction"] = DIRECTIONS[way]
    for key, value in (("trials", trials), ("pruner", pruner), ("sampler", sampler), ("timeout_s", timeout_s),
                       ("storage", storage)):
        if value is not None:
            out[key] = value
    return out
