"""The AMP speed-up measured side by side: for each FP32/AMP pair of the AMP table, one model (the
FP32 side's best/) trained a step at a time in the report's own process, fp32 and the AMP side's
precision alternating step by step, so other work on the machine slows both alike and the ratio of
the medians is the precision's. The cells' own samples/s were measured minutes apart, each under
whatever else ran then (confound.py says when that was so); this is the figure a busy machine
cannot make.

A step is what the loop does at the pair's shape: forward under autocast, a loss on the logits (the
task's own loss needs its labels; the encoder's work, which decides the step, is the same),
backward, AdamW; at the run's micro-batch and its mean row length rounded up to its
train.pad_to_multiple_of (the rows the run computed), capped at train.max_length. The record
(amp_step.json beside report.md): where and when, and per pair both medians and the ratio.
"""
from __future__ import annotations

import json
import math
import socket
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from pipeline.config.precision_modes import MODES
from pipeline.layout import OutputDir
from pipeline.report.compare import amp_pairs

FILE = "amp_step.json"
STEPS = 12
"""Timed steps per precision (after two untimed ones each)."""


def _autocast_dtype(precision: str) -> str | None:
    """The dtype an AMP side's resolved precision autocasts to; None for one that does not (fp32
    under auto, tf32, pure16): not timed."""
    mode = MODES.get(precision)
    return mode.compute if mode is not None and mode.autocast else None


def measure(cells: pd.DataFrame, device: str | None = None, steps: int = STEPS) -> dict:
    """Time each AMP pair's step side by side; the record (`reason` says why nothing ran, if so)."""
    pairs, skipped = [], {}
    for (task, model, procedure), fp32, amp in amp_pairs(cells) if not cells.empty else ():
        label = f"{task} / {model}" + (f" / {procedure}" if procedure != "train" else "")
        precision = "/".join(sorted(set(amp[amp.status == "finished"].precision.dropna().map(str))))
        shape = _shape(fp32[fp32.status == "finished"])
        if _autocast_dtype(precision) is None:
            skipped[label] = f"AMP ran {precision or 'nothing that finished'}: no autocast step to time"
        elif shape is None:
            skipped[label] = f"the FP32 side's best/ or {OutputDir.JOB} is not on this machine"
        else:
            pairs.append((label, precision, *shape))
    record = {"steps": steps, "pairs": {}, "not_measured": skipped, "reason": ""}
    if not pairs:
        return {**record, "reason": "; ".join(sorted(set(skipped.values()))) or "no FP32/AMP pair"}
    return _run(record, pairs, device)


def _shape(rows: pd.DataFrame) -> tuple[str, int, int] | None:
    """(best/ directory, micro-batch, row length) of the first finished run with its outputs here."""
    from pipeline.tracking import finished_stage

    for r in rows.itertuples():
        out = OutputDir(r.output_dir) if isinstance(r.output_dir, str) and r.output_dir else None
        if out is None or out.trained_model() is None or not out.job.is_file():
            continue
        stage = finished_stage.read(out, "report")
        train = stage.cfg.train
        rate, tokens = float(r.samples_per_s), float(r.tokens_per_s)
        mean = tokens / rate if rate > 0 and not math.isnan(tokens) else 0.0  # NaN > 0 is False
        multiple = train.pad_to_multiple_of
        length = min(train.max_length, max(multiple, math.ceil(mean / multiple) * multiple))
        return str(stage.best), train.batch_size, length
    return None


def _run(record: dict, pairs: list, device_name: str | None) -> dict:
    import torch

    from pipeline.measure.inference import serving_threads
    from pipeline.measure.load import LoadSampler
    from pipeline.measure.telemetry import cpu_bf16
    from pipeline.measure.telemetry import device_name as describe
    from pipeline.models import SavedModel

    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = datetime.now(timezone.utc)
    with serving_threads(device) as threads, LoadSampler(device) as load:
        for label, precision, best, batch, length in pairs:
            model = SavedModel(best).load(torch.float32, device).train()
            dtype = getattr(torch, _autocast_dtype(precision))
            times = _alternate(model, device, dtype, batch, length, record["steps"])
            fp32, amp = statistics.median(times["fp32"]), statistics.median(times["amp"])
            record["pairs"][label] = {"precision": precision, "batch_size": batch, "length": length, "model": best,
                                      "fp32_step_ms": 1000 * fp32, "amp_step_ms": 1000 * amp, "speedup": fp32 / amp,
                                      "fp32_ms_by_step": [1000 * t for t in times["fp32"]],
                                      "amp_ms_by_step": [1000 * t for t in times["amp"]]}
            del model
    record.update(host=socket.gethostname(), device=str(device), device_name=describe(device), threads=threads,
                  cpu_bf16=cpu_bf16() if device.type == "cpu" else "",
                  started_utc=started.isoformat(timespec="seconds"),
                  finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), load=load.last.figures())
    return record


def _alternate(model, device, dtype, batch: int, length: int, steps: int) -> dict[str, list[float]]:
    """Seconds per training step, fp32 and autocast(dtype) alternating (who goes first too); the
    first two of each untimed (kernels chosen, caches warmed)."""
    import torch

    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(5, vocab, (batch, length), device=device),
              "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times: dict[str, list[float]] = {"fp32": [], "amp": []}
    for i in range(steps + 2):
        for side in (("fp32", "amp") if i % 2 else ("amp", "fp32")):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=side == "amp"):
                logits = model(**inputs).logits
            logits.float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times[side].append(time.perf_counter() - start)
    return times


def write(record: dict, out: Path) -> None:
    (out / FILE).write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")


def sentences(record: dict | None) -> list[str]:
    """One sentence per pair timed, and why a pair was not; nothing where the report did not time."""
    if not record:
        return []
    lines = []
    where = (f"side by side in the report's process on `{record.get('host')}`, {record.get('device_name')}"
             + (f" ({record['cpu_bf16']} bf16)" if record.get("cpu_bf16") else ""))
    for label, p in record.get("pairs", {}).items():
        lines.append(f"{label}: one training step of its FP32 best/ model at {p['batch_size']} x {p['length']} "
                     f"tokens, timed {where}: fp32 {p['fp32_step_ms']:.1f} ms, {p['precision']} autocast "
                     f"{p['amp_step_ms']:.1f} ms: **{p['precision']} {p['speedup']:.2f}x** (medians of "
                     f"{record['steps']} steps each, the two precisions alternating, so the machine's other work "
                     "slows both alike).")
    lines += [f"{label}: AMP step not timed side by side: {why}."
              for label, why in record.get("not_measured", {}).items()]
    if not lines and record.get("reason"):
        lines.append(f"AMP step not timed side by side: {record['reason']}.")
    return lines
