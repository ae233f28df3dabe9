"""The report's vocabulary: its columns, the MLflow metrics they come from, and which columns
each table shows. Spelled once here; collect, tables, markdown and charts use these.
"""
from __future__ import annotations

from pipeline.names import (
    AVG_POWER,
    ENERGY_JOULES,
    EPOCH_TIME,
    EXPORT_SIZE_MB,
    GPU_UTIL,
    INFER_BATCH,
    INFER_LATENCY_P50,
    INFER_PARAMS,
    INFER_PARAMS_NO_EMBED,
    INFER_SAMPLES_PER_S,
    INFER_SIZE_MB,
    LOAD_OTHERS_CPU,
    LOAD_OTHERS_GPU_UTIL,
    PEAK_MEM_ALLOCATED,
    PEAK_RSS,
    SAMPLES_PER_S,
    TOKENS_PER_S,
    TRAIN_TIME,
    export_metric,
    export_test_metric,
    infer_length,
    infer_metric,
    load_metric,
    test_metric,
)

TEST_COLUMNS = ("precision", "recall", "f1", "map", "mrr")
"""The task metrics of the KD table: column test_NAME <- MLflow test/NAME."""
PAPER_COLUMNS = ("accuracy", "exact")
"""The AMP paper's other test metrics beside F1 (each task's main metric is its F1): accuracy
(sentiment, error classification, NER) and exact match (QA); n/a where the task has none."""
PAYOFF_PRECISION, PAYOFF_LENGTH = "fp32", "median"
"""The inference figures the payoff compares: fp32, which every stage measures on every device, at the
test split's median length (a 16-bit stage's own precision is in its run, infer/*/bf16/...)."""
EXPORT_VARIANTS = ("int8", "fp32")
"""The exported graphs the payoff shows (`pipeline export`'s export/VARIANT/* metrics), int8 first."""
METRICS = {
    "samples_per_s": SAMPLES_PER_S,
    "tokens_per_s": TOKENS_PER_S,
    "epoch_time_s": EPOCH_TIME,
    "train_time_s": TRAIN_TIME,
    "energy_j": ENERGY_JOULES,
    "gpu_util_pct": GPU_UTIL,
    "avg_power_w": AVG_POWER,
    **{f"test_{name}": test_metric(name) for name in (*TEST_COLUMNS, *PAPER_COLUMNS)},
    **{f"infer_{short}": metric for short, metric in (
        ("params", INFER_PARAMS), ("params_no_embed", INFER_PARAMS_NO_EMBED), ("size_mb", INFER_SIZE_MB))},
    "infer_latency_ms": infer_metric(INFER_LATENCY_P50, PAYOFF_PRECISION, PAYOFF_LENGTH),
    "infer_samples_per_s": infer_metric(INFER_SAMPLES_PER_S, PAYOFF_PRECISION, PAYOFF_LENGTH),
    "infer_length": infer_length(PAYOFF_LENGTH),
    "infer_batch": INFER_BATCH,
    **{f"export_{variant}_{short}": metric for variant in EXPORT_VARIANTS for short, metric in (
        ("main", export_test_metric(variant, "main")), ("size_mb", export_metric(variant, EXPORT_SIZE_MB)))},
    **{f"export_trim_{short}": export_metric("trim", short) for short in (
        "params", "params_no_embed", "size_mb", "vocab_size", "vocab_size_before")},
    "others_cpu": load_metric(LOAD_OTHERS_CPU),
    "others_gpu": load_metric(LOAD_OTHERS_GPU_UTIL),
}
"""Report column -> MLflow metric (the main metric and peak memory are picked per run, in collect)."""
MEMORY = {PEAK_MEM_ALLOCATED: "CUDA peak allocated", PEAK_RSS: "CPU peak RSS"}
"""The peak-memory metric a run has (the first one found) -> what the memory column says."""
COLUMNS = ("main", "peak_mem_mb", "cell_wall_s", "cell_export_s", *METRICS)
"""Every metric column of a cell row; cell_wall_s: the cell from start to finish, as the study
runner timed it: its stage (set-up, training, evaluation, the inference bench, saving) and its
export after it, where it has one; cell_export_s: the export alone."""
ENERGY_FIGURES = ("energy_j", "gpu_util_pct", "avg_power_w")
"""NVML's figures: n/a, never 0, on a run tagged energy_available=false (a CPU run)."""

AMP_COLUMNS = ("main", *(f"test_{name}" for name in PAPER_COLUMNS), "peak_mem_mb", "samples_per_s", "epoch_time_s",
               "energy_j")
"""The columns of each side (FP32, AMP) of the AMP table."""
AMP_DELTAS = ("speedup_pct", "mem_reduction_pct", "retention_pct")
"""The AMP table's comparisons of the two sides."""
KD_SHOWN = ("cell_wall_s", "cell_export_s", "train_time_s", "samples_per_s", "peak_mem_mb", "gpu_util_pct",
            "avg_power_w", "energy_j", *(f"test_{n}" for n in TEST_COLUMNS))
"""The columns of the KD table as written (CSV and markdown)."""
KD_COLUMNS = (*KD_SHOWN, "main")
"""The KD table's columns, with the main metric for its chart."""
SPREAD_COLUMNS = ("main", "test_map", "samples_per_s", "peak_mem_mb")
"""The columns compared against the seed spread (test_map: where the task has MAP)."""
