"""The report's vocabulary: its columns, the MLflow metrics they come from, and which columns
each table shows. Spelled once here; collect, tables, markdown and charts use these.
"""
from __future__ import annotations

from pipeline.names import (
    ENERGY_JOULES,
    EPOCH_TIME,
    PEAK_MEM_ALLOCATED,
    PEAK_RSS,
    SAMPLES_PER_S,
    TRAIN_TIME,
    test_metric,
)

AMP_PRECISIONS = ("fp16", "bf16", "bf16-pure", "auto")
FP32_PRECISIONS = ("fp32", "tf32")

TEST_COLUMNS = ("precision", "recall", "f1", "map", "mrr")
"""The task metrics of the KD table: column test_NAME <- MLflow test/NAME."""
METRICS = {
    "samples_per_s": SAMPLES_PER_S,
    "epoch_time_s": EPOCH_TIME,
    "train_time_s": TRAIN_TIME,
    "energy_j": ENERGY_JOULES,
    **{f"test_{name}": test_metric(name) for name in TEST_COLUMNS},
}
"""Report column -> MLflow metric (the main metric and peak memory are picked per run, in collect)."""
MEMORY = {PEAK_MEM_ALLOCATED: "CUDA peak allocated", PEAK_RSS: "CPU peak RSS"}
"""The peak-memory metric a run has (the first one found) -> what the memory column says."""
COLUMNS = ("main", "peak_mem_mb", *METRICS)
"""Every metric column of a cell row."""

AMP_COLUMNS = ("main", "peak_mem_mb", "samples_per_s", "epoch_time_s", "energy_j")
"""The columns of each side (FP32, AMP) of the AMP table."""
AMP_DELTAS = ("speedup_pct", "mem_reduction_pct", "retention_pct")
"""The AMP table's comparisons of the two sides."""
KD_SHOWN = ("train_time_s", "samples_per_s", "peak_mem_mb", "energy_j", *(f"test_{n}" for n in TEST_COLUMNS))
"""The columns of the KD table as written (CSV and markdown)."""
KD_COLUMNS = (*KD_SHOWN, "main")
"""The KD table's columns, with the main metric for its chart."""
SPREAD_COLUMNS = ("main", "test_map", "samples_per_s", "peak_mem_mb")
"""The columns compared against the seed spread (test_map: where the task has MAP)."""
