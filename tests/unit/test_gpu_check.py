"""`make gpu-check` (benchmarks/gpu_check.py) proves the GPU path on a CUDA machine within a budget; here
its --quick mode runs the script's own code on the CPU (tiny in-process jobs, fp32, compile off, pytest
collecting only, the demo as --dry-run, DeepSpeed left out), so the command a lent GPU will run is known
to work up to the GPU itself, and its plan of what fits a budget is checked on the estimates. What its
checks check on a GPU is not shown by this test."""
import importlib.util
import sys

from helpers import ROOT


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_plan_fits_the_budget_in_order_side_by_side_then_alone():
    gc = gpu_check()
    checks = gc.CHECKS
    estimates = {c.name: c.estimate_s for c in checks}
    run, not_run = gc.plan(checks, estimates, float("inf"), 3)
    assert [c.name for c in run] == [c.name for c in checks] and not not_run
    assert [c.name for c in run][-1] == "energy"  # alone, after the side-by-side ones
    est = {"ddp": 100, "fallback": 50, "grad_accum": 60, "deepspeed": 40, "pytest_gpu": 200, "demo": 30, "energy": 90}
    # lanes of 2: ddp 0-100, fallback 0-50, grad_accum 50-110, deepspeed 100-140, pytest_gpu would end at 310,
    # demo 110-140; energy alone from 140 to 230
    run, not_run = gc.plan(checks, est, 250, 2)
    assert [c.name for c in run] == ["ddp", "fallback", "grad_accum", "deepspeed", "demo", "energy"]
    assert list(not_run) == ["pytest_gpu"]
    run, not_run = gc.plan(checks, est, 200, 2)  # energy no longer fits after them
    assert "energy" in not_run and "alone" in not_run["energy"]
