"""`make gpu-check`: the GPU path a user runs by default, proven in one command on a CUDA machine
(budget: 20 minutes of one H100), with one JSON of pass/fail and figures per check:

- pytest_gpu: the whole `pytest -m gpu` suite (tests/test_gpu.py);
- demo: `make demo` on the GPU (launch/studies/demo-gpu.yaml), into this check's own store;
- fallback: `torchrun --nproc_per_node 2` on one GPU runs one process with grad_accum doubled under
  CUDA graphs; its losses against the same job with train.compile=off;
- grad_accum: grad_accum=2 under CUDA graphs in bf16 and in fp16 (GradScaler), each against eager;
- deepspeed: ZeRO-2 and ZeRO-3 in bf16 with train.compile=auto (what auto chose, and why);
- energy: joules per sample with and without compile (compile energy left out: EnergyMeter).

Tolerances: a compiled job's final training loss within LOSS_RTOL (relative) of eager's and its dev
score within SCORE_ATOL: inductor's fused 16-bit kernels round differently from eager's per-op ones,
and 40 steps amplify it; a .grad freed under CUDA graphs gives garbage or torch's "overwritten" error,
far outside both. Energy: compiled joules per sample at most ENERGY_RATIO x eager's (with compile
energy counted in, a short compiled job's would be several times eager's).

    python benchmarks/gpu_check.py [--only fallback,grad_accum] [--out FILE]
    python benchmarks/gpu_check.py --quick   # this script's own code on a CPU, tiny jobs in-process

--quick is a smoke run of this script, not of the GPU path: tiny model, fp32, compile off, no
launcher (the fallback by requested_world_size=2, which takes the same path in runtime/fallback.py),
pytest collecting only, the demo as --dry-run and DeepSpeed left out (its CPU launcher takes
minutes); its pass/fail says the script works. Not measured on a GPU yet (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOSS_RTOL = 0.05
SCORE_ATOL = 0.05
ENERGY_RATIO = 1.1
JOB_TIMEOUT_S = 600
NO_DROPOUT = ["model_config.hidden_dropout_prob=0", "model_config.attention_probs_dropout_prob=0"]
WIDE = ["model=preset:bangla-base", "model_config.hidden_size=768", "model_config.intermediate_size=3072",
        "model_config.num_attention_heads=12"]  # tests/test_gpu.py's: energy that is not noise
GPU_JOB = ["model=preset:bangla-tiny", "train.max_length=48", "train.lr=1e-3", "tracking.system_metrics=false",
           "train.batch_size=16", "train.max_steps=40", *NO_DROPOUT]
QUICK_JOB = ["model=preset:bangla-tiny", "train.max_length=32", "train.lr=1e-3", "tracking.system_metrics=false",
             "train.batch_size=8", "train.max_steps=2", "train.eval_batch_size=256", *NO_DROPOUT]
CHECKS = ("pytest_gpu", "demo", "fallback", "grad_accum", "deepspeed", "energy")


class Jobs:
    """Runs pipeline training jobs into one work directory and store; the same job (launcher and
    arguments) runs once. On a GPU each job is its own process under its launcher; with quick, in
    this process on the CPU (compile off, fp32: what the CPU here runs)."""

    def __init__(self, work: Path, quick: bool):
        self.work, self.quick, self.done = work, quick, {}
        self.db = work / "mlflow.db"

    def run(self, args: list[str], launcher: str = "none", nproc: int = 1) -> dict:
        """The job's final metrics, its resolved.* params and how it went: {ok, seconds, metrics, params, log}."""
        if self.quick:
            args = [a for a in args if not a.startswith(("precision=", "train.compile="))]
            args = [*args, "precision=fp32", "train.compile=off"]
            if launcher == "torchrun":
                args, launcher = [*args, f"requested_world_size={nproc}"], "none"
        key = (launcher, nproc, tuple(args))
        if key not in self.done:
            self.done[key] = self._run(args, launcher, nproc, self.work / f"job{len(self.done)}")
        return self.done[key]

    def _run(self, args: list[str], launcher: str, nproc: int, out: Path) -> dict:
        common = [*args, f"output_dir={out}", f"tracking.uri=sqlite:///{self.db}", "tracking.experiment=gpu-check"]
        start = time.perf_counter()
        if self.quick:
            from pipeline import train
            from pipeline.config import load_config

            try:
                train.run(load_config(None, common))
                ok, log = True, ""
            except Exception as e:  # noqa: BLE001 - a failed job is a failed check, reported
                ok, log = False, f"{type(e).__name__}: {e}"
        else:
            cmd = {"none": [sys.executable, "-m", "pipeline"],
                   "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={nproc}", "-m", "pipeline"],
                   "deepspeed": [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(nproc),
                                 "--module", "pipeline"]}[launcher]
            ok, log = run_command([*cmd, "train", *common])
        seconds = time.perf_counter() - start
        metrics_file = out / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        return {"ok": ok and bool(metrics), "seconds": round(seconds, 1), "metrics": metrics,
                "params": self._params(out), "log": log[-2000:]}

    def _params(self, out: Path) -> dict:
        """The resolved.* params of the job's MLflow run (what ran: compile, grad_accum, world size)."""
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{self.db}")
        experiment = client.get_experiment_by_name("gpu-check")
        if experiment is None:
            return {}
        for run in client.search_runs([experiment.experiment_id]):
            if run.data.params.get("output_dir") == str(out):
                return {k: v for k, v in run.data.params.items() if k.startswith("resolved.")}
        return {}


def run_command(cmd: list[str], timeout: int = JOB_TIMEOUT_S) -> tuple[bool, str]:
    """(exit code 0, the output's tail) of a command run from the repository root."""
    try:
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as e:
        return False, f"timed out after {timeout} s: {(e.stdout or '')[-1500:]}"
    return result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def compare(eager: dict, compiled: dict) -> dict:
    """A compiled job against eager: both ran, losses within LOSS_RTOL, dev scores within SCORE_ATOL."""
    from pipeline import names

    figures = {"eager_seconds": eager["seconds"], "compiled_seconds": compiled["seconds"],
               "compiled_params": compiled["params"]}
    if not (eager["ok"] and compiled["ok"]):
        return {"pass": False, **figures, "log": (compiled if eager["ok"] else eager)["log"]}
    e, c = eager["metrics"], compiled["metrics"]
    loss_gap = abs(c[names.TRAIN_LOSS] - e[names.TRAIN_LOSS]) / max(abs(e[names.TRAIN_LOSS]), 1e-12)
    score_gap = abs(c[names.EVAL_MAIN] - e[names.EVAL_MAIN])
    figures.update(eager_loss=e[names.TRAIN_LOSS], compiled_loss=c[names.TRAIN_LOSS], loss_rel_gap=loss_gap,
                   eager_dev=e[names.EVAL_MAIN], compiled_dev=c[names.EVAL_MAIN], dev_gap=score_gap,
                   compile_s=c.get(names.COMPILE_TIME), compiles=c.get(names.COMPILES))
    return {"pass": loss_gap <= LOSS_RTOL and score_gap <= SCORE_ATOL, **figures}


# ---------------------------------------------------------------------- the checks


def check_pytest_gpu(jobs: Jobs) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    ok, log = run_command([*cmd, "--collect-only"] if jobs.quick else cmd, timeout=900)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|tests? collected)", log)}
    return {"pass": ok, "counts": counts, "log": log[-1500:]}


def check_demo(jobs: Jobs) -> dict:
    cmd = [sys.executable, "-m", "pipeline", "study", "launch/studies/demo-gpu.yaml",
           f"tracking.uri=sqlite:///{jobs.work / 'demo.db'}"]
    start = time.perf_counter()
    ok, log = run_command([*cmd, "--dry-run"] if jobs.quick else cmd, timeout=900)
    return {"pass": ok, "seconds": round(time.perf_counter() - start, 1), "log": log[-1500:]}


def check_fallback(jobs: Jobs) -> dict:
    """Two torchrun processes on one GPU: the surplus rank leaves, one process trains with grad_accum
    doubled under CUDA graphs; against the same one-process job (grad_accum 2) with compile off."""
    job = [*(QUICK_JOB if jobs.quick else GPU_JOB), "precision=bf16"]
    fallen = jobs.run([*job, "train.compile=reduce-overhead"], launcher="torchrun", nproc=2)
    eager = jobs.run([*job, "train.grad_accum=2", "train.compile=off"])
    result = compare(eager, fallen)
    params = fallen["params"]
    ran_as_planned = (params.get("resolved.world_size"), params.get("resolved.grad_accum"),
                      params.get("resolved.requested_world_size")) == ("1", "2", "2")
    return {**result, "pass": result["pass"] and ran_as_planned, "one_process_grad_accum_2": ran_as_planned}


def check_grad_accum(jobs: Jobs) -> dict:
    """grad_accum=2 under CUDA graphs against eager, in bf16 and in fp16 (GradScaler)."""
    base = [*(QUICK_JOB if jobs.quick else GPU_JOB), "train.grad_accum=2"]
    per_precision = {}
    for precision in ("bf16", "fp16"):
        eager = jobs.run([*base, f"precision={precision}", "train.compile=off"])
        graphs = jobs.run([*base, f"precision={precision}", "train.compile=reduce-overhead"])
        per_precision[precision] = compare(eager, graphs)
    return {"pass": all(r["pass"] for r in per_precision.values()), **per_precision}


def check_deepspeed(jobs: Jobs) -> dict:
    """ZeRO-2 and ZeRO-3 in bf16 with train.compile=auto, one GPU under the deepspeed launcher."""
    if jobs.quick:
        return {"pass": True, "skipped": "quick: DeepSpeed's launcher on a CPU takes minutes"}
    per_stage = {}
    for stage in (2, 3):
        result = jobs.run([*GPU_JOB, "precision=bf16", "train.compile=auto", f"deepspeed=ds_configs/zero{stage}.json"],
                          launcher="deepspeed")
        from pipeline import names

        per_stage[f"zero{stage}"] = {"pass": result["ok"], "seconds": result["seconds"],
                                     "compile": result["params"].get("resolved.compile"),
                                     "compile_reason": result["params"].get("resolved.compile_reason"),
                                     "train_loss": result["metrics"].get(names.TRAIN_LOSS),
                                     "samples_per_s": result["metrics"].get(names.SAMPLES_PER_S),
                                     **({} if result["ok"] else {"log": result["log"]})}
    return {"pass": all(r["pass"] for r in per_stage.values()), **per_stage}


def check_energy(jobs: Jobs) -> dict:
    """Joules per sample of the same bf16 job eager and under CUDA graphs (compile energy left out)."""
    from pipeline import names

    # quick: grad_accum's eager job again (one job fewer; no energy counter on a CPU either way)
    job = [*QUICK_JOB, "train.grad_accum=2"] if jobs.quick else [*GPU_JOB, *WIDE, "train.max_steps=200"]
    runs = {mode: jobs.run([*job, "precision=bf16", f"train.compile={mode}"]) for mode in ("off", "reduce-overhead")}
    figures = {mode: {k: r["metrics"].get(k) for k in (names.JOULES_PER_SAMPLE, names.ENERGY_JOULES, names.AVG_POWER,
                                                       names.SAMPLES_PER_S, names.COMPILE_TIME)}
               for mode, r in runs.items()}
    if not all(r["ok"] for r in runs.values()):
        return {"pass": False, **figures, "log": next(r["log"] for r in runs.values() if not r["ok"])}
    eager, compiled = (figures[m][names.JOULES_PER_SAMPLE] for m in ("off", "reduce-overhead"))
    if eager is None or compiled is None:
        return {"pass": jobs.quick, **figures, "skipped": "no energy counter (a CPU, or NVML cannot read it)"}
    return {"pass": compiled <= ENERGY_RATIO * eager, "compiled_over_eager": compiled / eager, **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a CPU smoke run of this script (seconds, not a check)")
    parser.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    parser.add_argument("--out", type=Path, help="the JSON (default: benchmarks/results/gpu-check-MACHINE-DATE.json)")
    parser.add_argument("--work", type=Path, help="the jobs' outputs and MLflow store (default: a new temp folder)")
    opts = parser.parse_args(argv)
    import torch

    if not opts.quick and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; --quick runs this script's own code on the CPU", file=sys.stderr)
        return 2
    cache = os.environ.get("PIPELINE_CACHE")
    from common import machine, quiet, result_path

    if cache is None:  # common points it at a fresh folder; the user's cache is content-keyed: share it
        os.environ.pop("PIPELINE_CACHE", None)
    quiet()
    work = opts.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    jobs = Jobs(work, opts.quick)
    checks, start = {}, time.perf_counter()
    for name in opts.only.split(","):
        t0 = time.perf_counter()
        checks[name] = {**globals()[f"check_{name}"](jobs), "check_seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {'pass' if checks[name]['pass'] else 'FAIL'} ({checks[name]['check_seconds']} s)", flush=True)
    payload = {"benchmark": "gpu-check", "quick": opts.quick, "pass": all(c["pass"] for c in checks.values()),
               "seconds": round(time.perf_counter() - start, 1), "machine": machine(),
               "tolerances": {"loss_rtol": LOSS_RTOL, "score_atol": SCORE_ATOL, "energy_ratio": ENERGY_RATIO},
               "checks": checks}
    out = opts.out or result_path("gpu-check")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"{'all pass' if payload['pass'] else 'FAILED'}: {out}")
    return 0 if payload["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
