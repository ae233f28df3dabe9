"""Each section of report.md appears only for the studies it describes: every shipped study's report,
rendered from a synthetic store (the study's plan on its parent run, one finished run per cell), has
the sections its cells call for and no other, and no unformatted placeholder; the AMP headline names
what was compared with FP32 by its precision (tf32 is no AMP), failed arms included."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import ROOT
from pipeline import names
from pipeline.study import load_study
from pipeline.study.search_plan import best_cells, plan_search
from pipeline.tasks import get_task

SECTIONS = {"amp": "## AMP vs FP32", "kd": "## Knowledge distillation procedures",
            "ceiling": "## Memory ceiling", "seeds": "## Seeds: is the difference larger than the spread?",
            "predictions": "## What the predictions say"}
SHIPPED = {  # the sections each shipped study's report has
    "bangla_amp": {"amp", "seeds", "predictions"}, "demo": {"amp", "kd", "seeds", "predictions"},
    "demo-gpu": {"amp", "seeds", "predictions"}, "demo-gpu-check": {"amp", "seeds", "predictions"},
    "wikiqa_kd": {"kd", "seeds", "predictions"}, "wikiqa_kd_search": {"kd", "seeds", "predictions"},
    "bangla_search": set(),  # its trials and best configuration are search.md's
    "ceiling_12gb": {"ceiling"},  # its capped cells are rungs of a ladder: no AMP pair, no KD procedure
}


class _Runs(list):
    token = None


class _Store:
    """The MLflow client the report reads through, over hand-made runs."""

    def __init__(self, runs):
        self.runs = runs

    def get_experiment_by_name(self, name):
        return SimpleNamespace(experiment_id="1")

    def search_runs(self, *args, **kwargs):
        return _Runs(self.runs)

    def get_metric_history(self, run_id, key):
        run = next(r for r in self.runs if r.info.run_id == run_id)
        return [SimpleNamespace(value=run.data.metrics[key])]

    def log_artifacts(self, *args):
        pass

    def get_run(self, run_id):
        return next(r for r in self.runs if r.info.run_id == run_id)

    def log_batch(self, run_id, metrics=()):
        self.get_run(run_id).data.metrics.update({m.key: m.value for m in metrics})

    def download_artifacts(self, run_id, path, dst):
        """Each cell's test predictions as its job keeps them: its seed and precision move a few rows."""
        from pipeline import predictions

        run = self.get_run(run_id)
        tags = run.data.tags
        if names.TAG_CELL not in tags:
            raise FileNotFoundError(path)
        task, shift = tags["task"], int(tags["seed"]) + (tags[names.TAG_PRECISION] != "fp32")
        out = Path(dst) / "test.jsonl"
        predictions.write(out, _prediction_rows(task, shift), task=task, split="test",
                          labels=get_task(task).prediction_labels(), data="digest", model=tags["model"],
                          precision=tags[names.TAG_PRECISION], seed=int(tags["seed"]))
        return str(out)


def _prediction_rows(task: str, shift: int, n: int = 40) -> list[dict]:
    """n rows of the task's format, each `shift`-th one predicted wrong (other settings: other rows)."""
    wrong = [i % max(2, 7 - shift) == 0 for i in range(n)]
    if task == "ner":
        gold = [["B-" + t, "I-" + t, "O"] for t in ("PER", "LOC", "ORG", "PER")[: 1 + shift % 4]] * (n // 4)
        return [{"id": str(i), "gold": g, "pred": ["O"] * 3 if wrong[i] else g,
                 "entities": [] if wrong[i] else [[g[0][2:], 0, 1]]} for i, g in enumerate(gold)]
    if task == "qa":
        return [{"id": f"q{i}", "pred": "" if wrong[i] else "ঢাকা", "score": 2.0, "null_score": 1.0,
                 "gold": ["ঢাকা"] if i % 3 else [], "has_answer": bool(i % 3)} for i in range(n)]
    if task == "wikiqa":
        return [{"id": f"q{i // 4}:{i % 4}", "question": f"q{i // 4}", "score": 0.2 if wrong[i] else 0.9,
                 "pred": 0 if wrong[i] else 1, "gold": 1} for i in range(n)]
    labels = get_task(task).prediction_labels()
    rows = []
    for i in range(n):
        gold = labels[i % len(labels)]
        pred = labels[(i + 1) % len(labels)] if wrong[i] else gold
        rows.append({"id": str(i), "gold": gold, "pred": pred,
                     "probs": [0.8 if label == pred else 0.2 / (len(labels) - 1) for label in labels]})
    return rows


def _run(run_id, tags, metrics=None, params=None):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, run_name=run_id, status="FINISHED"),
                           data=SimpleNamespace(tags=tags, metrics=metrics or {}, params=params or {}))


def _metrics(task: str, precision: str) -> dict[str, float]:
    """A CPU run's figures: every test score its task logs, speed, memory, its served model's size."""
    from pipeline.tasks import get_task

    scores = {names.test_metric(k): 0.7 for k in get_task(task).metric_names() if "*" not in k}
    faster = precision != "fp32"
    return {**scores, names.TEST_MAIN: 0.7, names.EVAL_MAIN: 0.68, names.SAMPLES_PER_S: 120.0 if faster else 100.0,
            names.PEAK_RSS: 900.0 if faster else 1000.0, names.EPOCH_TIME: 5.0, names.TRAIN_TIME: 15.0,
            names.INFER_PARAMS: 2e7, names.INFER_PARAMS_NO_EMBED: 1e7, names.INFER_SIZE_MB: 80.0}


def _store(study, cells):
    """The study's parent run with each cell's plan, and a finished run per cell as its job leaves it."""
    parent = {names.PARENT_TAG: "true", names.TAG_STUDY: study.name}
    runs = []
    for cell in cells:
        plan = cell.plan
        parent[names.CELL_TAG_PREFIX + cell.name] = json.dumps({**plan, "status": "finished", "wall_s": 30.0})
        ran = "bf16" if plan["precision"] == "auto" else plan["precision"]
        tags = {names.TAG_CELL: cell.name, names.TAG_STUDY: study.name, names.TAG_PARENT_RUN: "parent",
                "task": plan["task"], "model": plan["model"], "seed": str(plan["seed"]),
                names.TAG_PRECISION: ran, names.TAG_PRECISION_REQUESTED: plan["precision"],
                names.TAG_DEVICE_TYPE: "cpu", names.TAG_ENERGY_AVAILABLE: "false", names.TAG_CPU_BF16: "AMX"}
        if plan["memory_limit_mb"] is not None:
            tags[names.TAG_BATCH_FIT] = "micro-batch 16 x grad_accum 1 (peak 700 MiB), of 12288 MiB (emulated cap)"
        runs.append(_run(f"run-{cell.name}", tags, _metrics(plan["task"], ran)))
    return [_run("parent", parent)] + runs


def _report_cells(study, cells):
    """The cells a study's report covers (a search's: its needed cells and its best configuration's
    re-runs), of the first model of the matrix where it has several: the sections depend on
    the other axes, and the report reads 144 cells no faster than it must."""
    if study.search:
        needed, groups = plan_search(study, cells)
        cells = needed + [c for g in groups for c in best_cells(study, g, {})]
    first = {axis: next((c.values[axis] for c in cells if axis in c.values), None) for axis in ("models",)}
    return [c for c in cells if all(c.values.get(axis, v) == v for axis, v in first.items())]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_studys_report_has_the_sections_it_describes(name, tmp_path, monkeypatch):
    import mlflow.tracking

    from pipeline import report

    study, cells = load_study(ROOT / "launch" / "studies" / f"{name}.yaml")
    runs = _store(study, _report_cells(study, cells))
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: _Store(runs))
    for chart in ("plot_amp", "plot_kd", "plot_payoff"):  # the charts are no part of the text
        monkeypatch.setattr(report, chart, lambda *args: [])
    monkeypatch.setattr(report.prediction_pairs, "plot_reliability", lambda *args: [])
    text = (report.write_report("synthetic://", study.name, tmp_path, timing=False) / "report.md").read_text()
    assert "{" not in text and "}" not in text, re.findall(r".{30}[{}].{30}", text)
    assert not re.search(r"\bnan\b", text), re.findall(r".{30}\bnan\b.{30}", text)
    assert {s for s, heading in SECTIONS.items() if heading in text} == SHIPPED[name]
    assert "AMP (tf32)" not in text and "AMP (fp32)" not in text


def test_every_shipped_study_is_checked():
    assert {p.stem for p in (ROOT / "launch" / "studies").glob("*.yaml")} == set(SHIPPED)


def _pair(requested, amp_status="ok", task="sentiment", model="m", ran=None, speedup=-12.0):
    ok = amp_status == "ok"
    return {"task": task, "model": model, "procedure": "train", "amp_requested": requested,
            "amp_precision": ran or requested, "fp32_status": "ok", "amp_status": amp_status,
            "speedup_pct": speedup if ok else float("nan"), "mem_reduction_pct": 1.0 if ok else float("nan"),
            "retention_pct": 99.0 if ok else float("nan"), "same_precision": False, "speed_confounded": "",
            "memory": "peak memory"}


def test_the_headline_names_what_was_compared_by_its_precision():
    """tf32 is compared with FP32 but is fp32 arithmetic, no AMP; a failed fp16 arm is named as fp16."""
    from pipeline.report.markdown import headline

    text = headline(pd.DataFrame([_pair("tf32"), _pair("bf16", speedup=30.0), _pair("fp16", "failed"),
                                  _pair("fp16", "failed", task="ner")]))
    assert "Averaged over 1 task x model cell, tf32 trained 12.0% slower than FP32" in text
    assert "AMP (tf32)" not in text
    assert "Averaged over 1 task x model cell, AMP (bf16) trained 30.0% faster" in text
    assert ("No task x model cell has both an FP32 and a fp16 run that finished (2 failed or are missing: "
            "sentiment / m: fp16 failed; ner / m: fp16 failed).") in text


def test_a_failed_arm_beside_finished_ones_is_named_in_its_precisions_sentence():
    from pipeline.report.markdown import headline

    text = headline(pd.DataFrame([_pair("fp16"), _pair("fp16", "missing", task="qa")]))
    assert text.startswith("Averaged over 1 task x model cell (1 more failed or are missing: qa / m: fp16 missing), "
                           "AMP (fp16) trained")
