"""Shared by the benchmark scripts (benchmarks/*.py and benchmarks/studies/*.py): the machine
description, alternating repetitions with medians, the model and features every contender starts
from, the pipeline run in-process, and the results file (`result_path`: NAME-MACHINE-DATE.json).

These machines are shared and noisy, so every benchmark measures ratios within one run: the
contenders alternate (A B A B ...) and each figure is a median over repetitions; a ratio is the
median of the per-repetition ratios, which cancels slow drifts of the machine's speed.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
"""The performance benchmarks' results."""
STUDY_RESULTS = ROOT / "benchmarks" / "studies" / "results"
"""The recipe and seed studies' results (benchmarks/studies/)."""
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="bench-"))
os.environ.setdefault("PIPELINE_CACHE", str(WORK / "cache"))


def cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields (the last processor's: all alike), {} where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}


def machine_slug() -> str:
    """The machine part of a results file's name: the GPU's name on a CUDA machine (`h100-80gb-hbm3`),
    else the CPU's bf16 support: `cpu-avx512bf16` where the CPU has AVX512-BF16 (the flag lscpu shows
    as avx512_bf16), `cpu-avx2` otherwise (or `cpu-ARCH` without AVX2)."""
    if torch.cuda.is_available():
        name = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")
        return name.removeprefix("nvidia-")
    flags = cpuinfo().get("flags", "").split()
    if "avx512_bf16" in flags:
        return "cpu-avx512bf16"
    return "cpu-avx2" if "avx2" in flags else f"cpu-{platform.machine().lower()}"


def result_path(name: str, results: Path = RESULTS) -> Path:
    """Where a run of benchmark NAME writes its figures: RESULTS/NAME-MACHINE-DATE.json (today's
    date), NAME being the benchmark and the parameters its runs differ in (`overhead-bf16`,
    `recipes-qa-epochs8-seeds1-10`)."""
    return results / f"{name}-{machine_slug()}-{datetime.date.today().isoformat()}.json"


def seeds_label(seeds: list[int]) -> str:
    """Seeds as a results file names them: `seeds1-10` (a range), `seeds3+5+6+9`, `seeds42`."""
    seeds = sorted(seeds)
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds{seeds[0]}-{seeds[-1]}"
    return "seeds" + "+".join(map(str, seeds))


def machine() -> dict:
    """CPU model, cores, GPU and library versions: every results file names its machine."""
    import transformers

    from pipeline.runtime import precision

    fields = cpuinfo()
    cpu = fields.get("model name") or platform.processor() or platform.machine()
    flags = fields.get("flags", "")
    return {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cpu_bf16": precision.cpu_supports_bf16(), "cpu_amx": "amx_bf16" in flags,
        "cpu_avx512_bf16": "avx512_bf16" in flags,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_count": torch.cuda.device_count(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
    }


def alternate(contenders: dict[str, Callable[[], dict]], reps: int) -> dict[str, list[dict]]:
    """Run each contender `reps` times, interleaved, rotating who goes first each round."""
    names = list(contenders)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            figures = contenders[name]()
            results[name].append(figures)
            shown = {k: v for k, v in figures.items() if isinstance(v, (int, float)) and
                     any(word in k for word in ("per_s", "time", "f1", "share"))}
            print(f"  rep {rep + 1}/{reps} {name}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()), flush=True)
    return results


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def ratio(numerator: list[dict], denominator: list[dict], key: str) -> float:
    """Median of the per-repetition ratios (pairs measured back to back)."""
    return statistics.median(a[key] / b[key] for a, b in zip(numerator, denominator))


def parser(doc: str, **defaults):
    """The options every benchmark shares (--reps, --batch-size, --max-length, --precision)."""
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=defaults.get("reps", 3))
    p.add_argument("--batch-size", type=int, default=defaults.get("batch_size", 32))
    p.add_argument("--max-length", type=int, default=defaults.get("max_length", 128))
    p.add_argument("--precision", default=defaults.get("precision", "bf16"), choices=["fp32", "bf16"])
    return p


def bare_step(model, optimizer, batch: dict, precision: str) -> None:
    """One training step as a hand-written loop does it: autocast, backward, clip, AdamW."""
    batch.pop("idx", None)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_model(task_name: str, model: str, max_length: int, seed: int = 0, train: str | None = None,
                splits: tuple[str, ...] = ("train", "dev")):
    """What every contender of a comparison starts from: the task's splits as a stage assembles them
    (pipeline/data/splits.py: the training file `train`, else the built-in sample set; dev and test
    the sample sets), the model and tokenizer from the pipeline's model factory seeded as the
    pipeline seeds before building one, and each split's features (the Dataset a stage's prepared
    features hold). -> (task, examples, tokenizer, model, features)."""
    import transformers

    from pipeline import models
    from pipeline.config.sections import SAMPLES, DataConfig
    from pipeline.data.splits import read_splits
    from pipeline.runtime.world import Runtime
    from pipeline.tasks import get_task

    task = get_task(task_name)
    stage_splits = read_splits(task, DataConfig(train=train, dev=SAMPLES, test=SAMPLES),
                               Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu")), splits)
    transformers.set_seed(seed)
    tokenizer, model = models.build(model, task, stage_splits.examples["train"].texts, {}, max_length)
    features = {split: prepared.dataset for split, prepared in stage_splits.features(tokenizer, max_length).items()}
    return task, stage_splits.examples, tokenizer, model, features


def long_sentiment_file(rows: int = 2400, median_words: float = 30, sigma: float = 0.7, seed: int = 0) -> Path:
    """A sentiment training file in the BLP-2023 format whose comments have a long-tailed length
    (log-normal word counts), like social-media text; the built-in sample set's one-sentence
    comments (~9 tokens) would measure mostly per-step overhead, not the model."""
    import csv
    import math
    import random

    import numpy as np

    from pipeline.tasks import samples
    from pipeline.tasks.sentiment import LABELS

    path = WORK / f"sentiment-long-{rows}-{median_words}-{sigma}-{seed}.tsv"
    if path.exists():
        return path
    rng, lengths = random.Random(seed), np.random.default_rng(seed).lognormal(math.log(median_words), sigma, rows)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "label"])
        for i, words in enumerate(lengths):
            label, text = rng.choice(LABELS), ""
            while len(text.split()) < words:
                text += " " + samples.sentiment_sentence(rng, label)
            writer.writerow([f"long-{i:05d}", text.strip(), label])
    return path


def seed_list(spec: str) -> list[int]:
    """--seeds as a list: "1-10" (a range, both ends included) or "1,3,5"."""
    if "-" in spec:
        low, high = spec.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in spec.split(",")]


def pipeline_run(overrides: list[str], stage: str = "train") -> dict:
    """One stage through the real pipeline (job/run.py), in this process; its figures."""
    from pipeline.config import load_config
    from pipeline.job.run import run

    out = Path(tempfile.mkdtemp(dir=WORK))
    cfg = load_config(None, [f"output_dir={out}", f"tracking.uri=sqlite:///{WORK}/mlflow.db",
                             "tracking.experiment=bench", "tracking.system_metrics=false", *overrides])
    return run(cfg, stage)


def last_run():
    """The newest MLflow run of pipeline_run's experiment (its tags, its metric history)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{WORK}/mlflow.db")
    experiment = client.get_experiment_by_name("bench")
    (run,) = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
    return client, run


def quiet() -> None:
    logging.basicConfig(level=logging.WARNING)
    for name in ("pipeline", "mlflow", "transformers", "alembic", "deepspeed", "torch"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else ("–" if v is None else str(v))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def save(name: str, rows: list[dict], columns: list[str], settings: dict, runs: dict | None = None,
         results: Path = RESULTS) -> Path:
    """Print the table and write result_path(name, results): NAME-MACHINE-DATE.json, the machine,
    command, settings, every repetition and the table in it."""
    info = machine()
    table = markdown_table(rows, columns)
    print(f"\n{name} on {info['gpu'] or info['cpu']} ({info['cores']} cores)\n{table}\n")
    path = result_path(name, results)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": info,
               "settings": settings, "rows": rows, "table": table, "runs": runs or {}}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"written {path.relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path}")
    return path
