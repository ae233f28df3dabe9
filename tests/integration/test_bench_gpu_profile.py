"""bench_gpu.py's profile tables without a GPU: --floors (each class's floor on a named GPU, the
model on the meta device) and --tables (a results file's class tables, and the partial split of an
older file that kept only its top kernels). What a GPU run measures is not shown here."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT


def bench_gpu(*args):
    result = subprocess.run([sys.executable, "benchmarks/bench_gpu.py", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The markdown table under the first line starting with `heading`: first cell -> other cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = {}
    for line in lines[start + 3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_floors_put_the_fused_attention_flops_apart_and_autocast_casts_only_under_bf16():
    out = bench_gpu("--floors", "NVIDIA H200", "--models", "tiny", "--precisions", "bf16,bf16-pure",
                    "--batches", "2", "--lengths", "8")
    autocast, pure = table(out, "tiny, bf16, 2 x 8"), table(out, "tiny, bf16-pure, 2 x 8")
    # torch's fused-attention formulas: forward 2 and backward 5 (scores recomputed) batched matmuls
    # of 2 x 2 heads x 8 x 32 x 8 multiply-adds each, in 2 layers
    assert float(autocast["attention"][1]) == pytest.approx(2 * 7 * 2 * (2 * 2) * 8 * 32 * 8 / 1e9, rel=1e-3)
    assert float(autocast["casts"][0]) > 0 and float(pure["casts"][0]) == 0
    assert float(pure["optimizer"][0]) < float(autocast["optimizer"][0])  # 30 against 32 bytes a parameter
    assert autocast["other"][0] == "–"  # no floor


@pytest.mark.slow
def test_tables_print_a_results_files_class_tables(tmp_path):
    classes = ["matmul", "attention", "optimizer", "norm+dropout+residual", "activation", "casts", "other"]
    profile = {"window_ms": 10.0, "busy_ms": 9.0, "busy_share": 0.9, "idle_ms": 1.0,
               "classes": {c: {"ms": 5.0, "launches": 9.0} for c in classes},
               # as classed when it ran; the tables re-class by name (a GEMM and a cast kernel here)
               "kernels": {"nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT": {"ms": 1.0, "launches": 2.0,
                                                                              "class": "other"},
                           "triton_poi_fused__to_copy_7": {"ms": 1.0, "launches": 2.0, "class": "other"}},
               "floors_ms": {**dict.fromkeys(classes), "matmul": 0.5}, "flops_by_kind": {}, "step_bytes": {}}
    rows = [{"model": "m", "precision": p, "compile": "reduce-overhead", "variant": "default", "batch": 32,
             "seq": 256, "profile": profile} for p in ("bf16", "bf16-pure")]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"rows": rows}))
    out = bench_gpu("--tables", str(path))
    ms_launches_floor_ratio = table(out, "m, 32 x 256, bf16 reduce-overhead:")["matmul"]
    assert ms_launches_floor_ratio == ["1", "2", "0.5", "2"]
    side = table(out, "m, 32 x 256: ms a step by class")
    assert side["busy (union)"] == ["9", "9"] and side["casts launches"] == ["2", "2"]
    assert side["other"] == ["0", "0"]


@pytest.mark.slow
def test_an_older_results_file_gets_its_top_kernels_classified():
    out = bench_gpu("--tables", "benchmarks/results/gpu-profile-bf16-32x256-h100-80gb-hbm3-2026-11-24.json")
    assert "only the top kernels were kept" in out
    split = table(out, "BanglaBERT (ELECTRA-base), 32 x 256")
    assert float(split["optimizer"][0]) == pytest.approx(1.179, abs=1e-3)  # the kernel, not its annotation range
