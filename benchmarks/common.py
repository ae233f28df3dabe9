"""Shared by the benchmark scripts: the machine description, alternating repetitions with
medians, the pipeline run in-process, and the results file.

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
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="bench-"))
os.environ.setdefault("PIPELINE_CACHE", str(WORK / "cache"))


def machine() -> dict:
    """CPU model, cores, GPU and library versions: every results file names its machine."""
    import transformers

    from pipeline.runtime import precision

    try:
        cpuinfo = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        cpuinfo = {}
    fields = {key.strip(): value.strip() for key, value in cpuinfo.items()}  # the last processor's (all alike)
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
    """One stage through the real pipeline (train.run), in this process; its figures."""
    from pipeline import train
    from pipeline.config import load_config

    out = Path(tempfile.mkdtemp(dir=WORK))
    cfg = load_config(None, [f"output_dir={out}", f"tracking.uri=sqlite:///{WORK}/mlflow.db",
                             "tracking.experiment=bench", "tracking.system_metrics=false", *overrides])
    return train.run(cfg, stage)


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


def save(name: str, rows: list[dict], columns: list[str], settings: dict, runs: dict | None = None) -> Path:
    """Print the table and write benchmarks/results/NAME-DEVICE.json (the machine included)."""
    info = machine()
    device = (info["gpu"] or "cpu").replace(" ", "-").lower()
    table = markdown_table(rows, columns)
    print(f"\n{name} on {info['gpu'] or info['cpu']} ({info['cores']} cores)\n{table}\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{device}.json"
    payload = {"benchmark": name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": info,
               "settings": settings, "rows": rows, "table": table, "runs": runs or {}}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"written {path.relative_to(ROOT)}")
    return path
