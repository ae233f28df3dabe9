"""A search study's report (search.md beside report.md): per searched group, the space, each
trial's fate, value, parameters and dev figures at each evaluation (from its Optuna study), the
importance of each parameter (optuna.importance, its default evaluator), and the best configuration
with its figures over the study's seeds (mean and spread) and the command that runs it again.

A degenerate search says so instead of reading as a finding: trials whose test predictions
collapsed (their run's stall tag, measure/collapse.py) are marked, completed trials that all scored
the same are named as such, importance is left out where the values cannot rank the parameters,
and a best trial that ties with others is called a tie.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.fsutil import write_text


@dataclass
class SearchSection:
    """One searched group, as the study runner hands it over."""

    group: str
    optuna_name: str
    space: list[tuple[str, str]]
    """(config key, distribution in words)."""
    best_by_seed: dict[str, dict[str, float]] = field(default_factory=dict)
    """Seed -> the best configuration's final metrics with that seed (the objective, test/main ...)."""
    rerun: str = ""
    """The command that runs the best configuration as a stage of its own."""
    champion: str = ""
    """What became of the `champion` alias (study/champion.py), in a sentence; "" without search.champion."""
    stalled: dict[int, str] = field(default_factory=dict)
    """Trial number -> why its run's test predictions collapsed (its stall_reason tag)."""


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def importances(optuna_study) -> dict[str, float] | str:
    """Each parameter's importance for the objective, or why there is none: it takes two completed
    trials and more distinct values than parameters (with all values equal the evaluator's shares
    are arbitrary; one parameter's share is 1 whatever the values)."""
    import optuna

    complete = optuna_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    values = {t.value for t in complete}
    params = {k for t in complete for k in t.params}
    if len(complete) < 2:
        return f"n/a ({len(complete)} completed trial(s); it takes 2)"
    if len(values) == 1:
        return f"n/a (every completed trial scored {next(iter(values)):.4f})"
    if len(params) == 1:
        return "n/a (one parameter searched: its share is 1 whatever the trials scored)"
    if len(values) <= len(params):
        return (f"n/a ({len(values)} distinct values among {len(complete)} completed trials: {len(params)} "
                f"parameters take at least {len(params) + 1})")
    try:
        return optuna.importance.get_param_importances(optuna_study)
    except (RuntimeError, ValueError) as e:  # e.g. every completed trial has the same parameters
        return f"n/a ({e})"


def render_search(name: str, storage: str, settings: str, objective: str, sections: list[SearchSection]) -> str:
    import optuna

    lines = [f"# Search: {name}", "", f"Objective: {objective}; {settings}.", f"Optuna storage: `{storage}`.", ""]
    for sec in sections:
        study = optuna.load_study(study_name=sec.optuna_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        fates = {s.name.lower(): sum(t.state == s for t in trials) for s in optuna.trial.TrialState}
        lines += [f"## {sec.group}", "", f"Optuna study `{sec.optuna_name}`: {len(trials)} trials ("
                  + ", ".join(f"{n} {k}" for k, n in fates.items() if n) + ").", "", "Space:", "",
                  "| parameter | distribution |", "|---|---|", *(f"| {k} | {d} |" for k, d in sec.space), ""]
        keys = [k for k, _ in sec.space]
        lines += ["| trial | fate | value | " + " | ".join(keys) + " | dev at each evaluation |",
                  "|---" * (4 + len(keys)) + "|"]
        for t in trials:
            value = f"{t.value:.4f}" if t.value is not None else "-"
            evals = ", ".join(f"{v:.3f}" for _, v in sorted(t.intermediate_values.items()))
            fate = t.state.name.lower() + (" (stalled)" if t.number in sec.stalled else "")
            lines.append(f"| {t.number} | {fate} | {value} | "
                         + " | ".join(_fmt(t.params.get(k)) for k in keys) + f" | {evals} |")
        lines += _degenerate(sec, [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE], objective)
        imp = importances(study)
        shown = imp if isinstance(imp, str) else ", ".join(f"{k} {v:.2f}" for k, v in imp.items())
        lines += ["", f"Parameter importance (optuna.importance, its default evaluator): {shown}", ""]
        try:
            best = study.best_trial
        except ValueError:
            lines += ["No trial completed: no best configuration.", ""]
            continue
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in best.params.items())
        tied = [t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value == best.value]
        if len(tied) > 1:  # Optuna keeps the first of them: nothing made it better than the others
            lines += [f"Best configuration: a tie of trials {', '.join(map(str, tied))} ({objective} "
                      f"{best.value:.4f} with their search seed); Optuna's best trial is the first of them, trial "
                      f"{best.number}, {params}, and it is the one re-run over the study's seeds."]
        else:
            lines += [f"Best configuration: trial {best.number}, {params} ({objective} {best.value:.4f} with its "
                      "search seed)."]
        figures = sorted({k for m in sec.best_by_seed.values() for k in m})
        if sec.best_by_seed:
            lines += ["", "Over the study's seeds:", "", "| seed | " + " | ".join(figures) + " |",
                      "|---" * (1 + len(figures)) + "|"]
            for seed, m in sec.best_by_seed.items():
                lines.append(f"| {seed} | " + " | ".join(_fmt(m.get(k)) for k in figures) + " |")
            means = {k: spread(vals) for k in figures
                     if (vals := [m[k] for m in sec.best_by_seed.values() if m.get(k) is not None])}
            lines += ["", f"Mean ± spread (sample sd) over {len(sec.best_by_seed)} seed(s): "
                      + "; ".join(f"{k} {m:.4f} ± {s:.4f}" for k, (m, s) in means.items()) + "."]
        if sec.champion:
            lines += ["", f"Champion: {sec.champion}."]
        lines += ["", "Run it again:", "", "```", sec.rerun, "```", ""]
    return "\n".join(lines)


def _degenerate(sec: SearchSection, complete: list, objective: str) -> list[str]:
    """The lines that say the trials compare nothing: collapsed runs, every value the same."""
    lines = []
    if sec.stalled:
        lines += ["", f"Stalled (the trial's test predictions collapsed, so its {objective} ranks no "
                  "configuration): " + "; ".join(f"trial {n}: {why}" for n, why in sorted(sec.stalled.items())) + "."]
    values = {t.value for t in complete}
    if len(complete) > 1 and len(values) == 1:
        lines += ["", f"Every completed trial ({len(complete)}) scored {objective} {values.pop():.4f}: the search "
                  "found no difference between its configurations (runs that collapse to one answer score alike)."]
    return lines


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_search_report(report_dir: Path, text: str, client=None, parent: str | None = None) -> Path:
    """search.md into report_dir, and as an artifact (report/) of the study's parent run."""
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / "search.md"
    write_text(out, text)
    if client is not None and parent:
        client.log_artifact(parent, str(out), "report")
    return out
