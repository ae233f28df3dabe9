"""`make gpu-check` (benchmarks/gpu_check.py) proves the GPU path on a CUDA machine within a budget; its
--quick mode runs the script's own code on the CPU (tests/integration/test_gpu_check.py). Here: its plan of
what fits a budget, checked on the estimates; the JSON under the out folder; and energy skipped, not
failed, where there is no energy counter. What its checks check on a GPU is not shown by these tests."""
import importlib.util
import json
import sys

from helpers import ROOT


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_mfu_cells_run_alone_first_then_the_others_side_by_side_within_the_budget():
    gc = gpu_check()
    checks = gc.CHECKS
    assert [[c.name for c in p] for p in gc.runner.phases(checks)] == [
        ["mfu"], ["ddp", "demo", "pytest_gpu", "fallback", "deepspeed"]]
    run, not_run = gc.runner.plan(checks, {c.name: c.estimate_s for c in checks}, float("inf"), 3)
    assert [c.name for c in run] == [c.name for c in checks] and not not_run
    est = {"mfu": 100, "ddp": 100, "demo": 50, "pytest_gpu": 200, "fallback": 60, "deepspeed": 40}
    # mfu 0-100 alone; lanes of 2 from 100: ddp 100-200, demo 100-150, pytest_gpu would end at 150 + 200,
    # fallback 150-210, deepspeed 200-240
    run, not_run = gc.runner.plan(checks, est, 300, 2)
    assert [c.name for c in run] == ["mfu", "ddp", "demo", "fallback", "deepspeed"]
    assert list(not_run) == ["pytest_gpu"] and "from ~150 s" in not_run["pytest_gpu"]
    # mfu alone would pass 90 s: left out, the others from 0: demo 0-50, fallback 0-60, deepspeed 50-90
    run, not_run = gc.runner.plan(checks, est, 90, 2)
    assert [c.name for c in run] == ["demo", "fallback", "deepspeed"] and "alone" in not_run["mfu"]


def test_the_default_plan_fits_the_make_targets_budget_with_every_check():
    """By the estimates from the recorded H100 times (not measured as a check on a GPU)."""
    gc = gpu_check()
    run, not_run = gc.runner.plan(gc.CHECKS, {c.name: c.estimate_s for c in gc.CHECKS}, gc.BUDGET_S, 4)
    assert not not_run and len(run) == len(gc.CHECKS)


def test_the_json_lies_in_the_out_folder_and_is_rewritten_after_every_check(tmp_path):
    gc = gpu_check()
    out = tmp_path / "results" / "run1"
    report = gc.runner.Report(out, {"run": ["mfu", "ddp"]}, {}, {})
    report.write()
    assert json.loads((out / "gpu-check.json").read_text())["checks"] == {}
    report.add("ddp", {"pass": True, "check_seconds": 1.0})
    written = json.loads((out / "gpu-check.json").read_text())
    assert written["checks"] == {"ddp": {"pass": True, "check_seconds": 1.0}} and not written["complete"]
    report.add("mfu", {"pass": False})
    written = json.loads((out / "gpu-check.json").read_text())
    assert list(written["checks"]) == ["mfu", "ddp"] and written["complete"] and not written["pass"]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json"]  # no temporary file left beside it


def cells(j_per_sample: dict) -> list[dict]:
    return [{"precision": "bf16", "batch": b, "seq": 256, "compile": mode, "J/sample": j}
            for (b, mode), j in j_per_sample.items()]


def test_energy_is_skipped_and_passes_without_a_counter_and_fails_when_compiled_costs_more():
    gc = gpu_check()
    none = gc.energy(cells({(32, "eager"): None, (32, "reduce-overhead"): None}))
    assert none["pass"] and "no energy counter" in none["skipped"]
    fine = gc.energy(cells({(32, "eager"): 2.0, (32, "reduce-overhead"): 1.0, (64, "eager"): 1.0,
                            (64, "reduce-overhead"): 1.05}))
    assert fine["pass"] and fine["compiled_over_eager"] == {"bf16 32x256": 0.5, "bf16 64x256": 1.05}
    worse = gc.energy(cells({(32, "eager"): 1.0, (32, "reduce-overhead"): 1.2}))
    assert not worse["pass"]
    eager_only = gc.energy(cells({(32, "eager"): 1.0}))  # quick: no compiled cell to compare
    assert eager_only["pass"] and "skipped" in eager_only
