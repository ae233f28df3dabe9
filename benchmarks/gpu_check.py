"""`make gpu-check`: the GPU path a user runs by default, proven on a CUDA machine within a budget
(default BUDGET_S: 8 minutes of one H100 with the node's install), with one JSON of pass/fail and figures
per check, rewritten after every check so that a kill keeps what finished. Everything it writes (the
JSON, each check's log and each job's, the MFU cells' results and profile tables) lies under one folder,
--out DIR; the jobs' weights and stores under --work (default: a temporary folder). The checks, in the
order of what they answer (CHECKS):

- mfu: alone on the GPU, the MFU cells (bench_gpu.py: BanglaBERT size, bf16, 32 x 256 and 64 x 256,
  eager and under CUDA graphs, profiled), and from the same cells energy per sample with and without
  compile (compile energy left out; skipped where NVML has no energy counter);
- ddp: two torchrun ranks sharing the GPU over gloo (PIPELINE_SHARE_GPU=1; NCCL refuses two ranks on
  one device), with train.compile=auto (eager under DDP today) and under CUDA graphs (what auto would
  pick once this passes), each against one process at the same global batch;
- demo: the GPU demo with one seed (launch/studies/demo-gpu-check.yaml), into this check's own store;
- pytest_gpu: `pytest -m gpu` (tests/integration/test_gpu.py) at most PYTEST_GPU_S, less its bf16
  grad_accum-under-CUDA-graphs test, which the fallback check runs (fp16's runs there);
- fallback: `torchrun --nproc_per_node 2` on one GPU runs one process with grad_accum doubled under
  CUDA graphs (bf16); its losses against the same job with train.compile=off;
- deepspeed: ZeRO-2 and ZeRO-3 in bf16 with train.compile=auto (what auto chose, and why).

mfu runs alone, first; the others side by side, up to --parallel processes (small models: the GPU has
room; none is timed against another). --budget SECONDS runs what fits by each check's estimate
(ESTIMATE_S; --estimates reads a previous run's JSON instead) and lists the rest as not run; a check
still running at the end of the budget is stopped with its whole process tree and recorded as such.

Tolerances: a compiled job's final training loss within LOSS_RTOL (relative) of eager's and its dev
score within SCORE_ATOL: inductor's fused 16-bit kernels round differently from eager's per-op ones,
and 40 steps amplify it; a .grad freed under CUDA graphs gives garbage or torch's "overwritten" error,
far outside both. Energy: compiled joules per sample at most ENERGY_RATIO x eager's.

    python benchmarks/gpu_check.py [--budget 390] [--only ddp,fallback] [--parallel 4] [--out DIR]
    python benchmarks/gpu_check.py --quick --out DIR   # this script's own code on a CPU, tiny jobs in-process

--quick is a smoke run of this script, not of the GPU path: tiny model, fp32, compile off, no
launcher (the fallback and DDP's two ranks by requested_world_size=2, which takes the same path in
runtime/fallback.py), bench_gpu.py --quick for the cells, pytest collecting only, the demo as
--dry-run and DeepSpeed left out (its CPU launcher takes minutes); its pass/fail says the script works.
Not measured on a GPU yet (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import check_runner as runner  # noqa: E402 - beside this script
import process_tree  # noqa: E402

LOSS_RTOL = 0.05
SCORE_ATOL = 0.05
ENERGY_RATIO = 1.1
BUDGET_S = 390
"""make gpu-check's budget: 8 minutes of one H100 less 90 s for the node's install and the imports."""
PYTEST_GPU_S = 210
JOB_TIMEOUT_S = 600
NO_DROPOUT = ["model_config.hidden_dropout_prob=0", "model_config.attention_probs_dropout_prob=0"]
GPU_JOB = ["model=preset:bangla-tiny", "train.max_length=48", "train.lr=1e-3", "tracking.system_metrics=false",
           "train.batch_size=16", "train.max_steps=40", *NO_DROPOUT]
QUICK_JOB = ["model=preset:bangla-tiny", "train.max_length=32", "train.lr=1e-3", "tracking.system_metrics=false",
             "train.batch_size=8", "train.max_steps=2", "train.eval_batch_size=256", *NO_DROPOUT]
MFU_CELLS = ["--models", "banglabert", "--precisions", "bf16", "--batches", "32,64", "--lengths", "256",
             "--compile", "eager,reduce-overhead", "--reps", "1", "--seconds", "3", "--profile"]
"""The open MFU question's cells (benchmarks/README.md, "The AMP table on one H100"), eager beside them
for the energy comparison."""
PYTEST_LEFT_OUT = ["tests/integration/test_gpu.py::test_grad_accumulation_under_cuda_graphs_trains_like_eager[bf16]"]
"""What the fallback check runs already (bf16, grad_accum 2 under CUDA graphs against eager)."""


class Jobs:
    """Runs pipeline training jobs into one work directory and store, their logs under `logs`; the same
    job (launcher and arguments) runs once. On a GPU each job is its own process under its launcher;
    with quick, in this process on the CPU (compile off, fp32: what the CPU here runs)."""

    def __init__(self, work: Path, quick: bool, logs: Path):
        self.work, self.quick, self.logs, self.done = work, quick, logs, {}
        self.db = work / "mlflow.db"

    def run(self, args: list[str], launcher: str = "none", nproc: int = 1, env: dict | None = None) -> dict:
        """The job's final metrics, its resolved.* params and how it went: {ok, seconds, metrics, params, log}."""
        if self.quick:
            args = [a for a in args if not a.startswith(("precision=", "train.compile="))]
            args = [*args, "precision=fp32", "train.compile=off"]
            if launcher == "torchrun":
                args, launcher, env = [*args, f"requested_world_size={nproc}"], "none", None
        key = (launcher, nproc, tuple(args), tuple(sorted((env or {}).items())))
        if key not in self.done:
            self.done[key] = self._run(args, launcher, nproc, f"job{len(self.done)}", env or {})
        return self.done[key]

    def _run(self, args: list[str], launcher: str, nproc: int, name: str, env: dict) -> dict:
        out = self.work / name
        common = [*args, f"output_dir={out}", f"tracking.uri=sqlite:///{self.db}", "tracking.experiment=gpu-check"]
        start = time.perf_counter()
        if self.quick:
            from pipeline.config import load_config
            from pipeline.job.run import run

            try:
                run(load_config(None, common))
                ok, log = True, ""
            except Exception as e:  # noqa: BLE001 - a failed job is a failed check, reported
                ok, log = False, f"{type(e).__name__}: {e}"
        else:
            cmd = {"none": [sys.executable, "-m", "pipeline"],
                   "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={nproc}", "-m", "pipeline"],
                   # the launcher's module, not its script: no script where packages went in with --target
                   "deepspeed": [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc),
                                 "--module", "pipeline"]}[launcher]
            ok, log = run_command([*cmd, "train", *common], self.logs / f"{name}.log", env=env)
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


def run_command(cmd: list[str], log: Path, timeout: int = JOB_TIMEOUT_S, env: dict | None = None) -> tuple[bool, str]:
    """(exit code 0, the output's tail) of a command run from the repository root, its output in `log`."""
    return process_tree.run(cmd, log, timeout, ROOT, {"OMP_NUM_THREADS": "1", **(env or {})})


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


def check_mfu(jobs: Jobs) -> dict:
    """The MFU cells alone on the GPU (bench_gpu.py into this check's folder, its profile tables beside
    them), and energy per sample under CUDA graphs against eager from the same cells."""
    folder = jobs.logs / "cells"
    cmd = [sys.executable, "benchmarks/bench_gpu.py", "--name", "gpu-check-mfu", "--out", str(folder)]
    ok, log = run_command([*cmd, *(["--quick", "--profile"] if jobs.quick else MFU_CELLS)], jobs.logs / "bench_gpu.log")
    files = [f for f in sorted(folder.glob("*.json")) if not f.name.endswith(".partial.json")]
    rows = json.loads(files[-1].read_text())["rows"] if files else []
    cells = [{k: r.get(k) for k in ("model", "precision", "compile", "batch", "seq", "samples/s", "MFU", "J/sample",
                                    "W", "peak MB", "compile s")} for r in rows]
    ran = ok and bool(cells) and all(isinstance(c["samples/s"], float) for c in cells)
    return {"pass": ran, "cells": cells, "energy": energy(cells), **({} if ran else {"log": log[-1500:]})}


def energy(cells: list[dict]) -> dict:
    """Compiled joules per sample over eager's, per shape and precision, from the cells; `skipped` (which
    passes) where a cell has no energy figure: no NVML energy counter (a CPU, a pre-Volta GPU, no permission)."""
    pairs = {}
    for c in cells:
        pairs.setdefault((c["precision"], c["batch"], c["seq"]), {})[c["compile"]] = c.get("J/sample")
    pairs = {k: v for k, v in pairs.items() if {"eager", "reduce-overhead"} <= set(v)}
    if not pairs:
        return {"pass": True, "skipped": "no cell ran both eager and under CUDA graphs"}
    if any(v is None for p in pairs.values() for v in p.values()):
        return {"pass": True, "skipped": "no energy counter (a CPU, or NVML cannot read it)"}
    ratios = {f"{p} {b}x{s}": v["reduce-overhead"] / v["eager"] for (p, b, s), v in pairs.items()}
    return {"pass": all(r <= ENERGY_RATIO for r in ratios.values()), "compiled_over_eager": ratios}


def check_ddp(jobs: Jobs) -> dict:
    """Two DDP ranks on the one GPU over gloo (batch 16 each) against one process at batch 32, eager:
    with train.compile=auto (what it picks under DDP, and why) and with CUDA graphs (what auto would
    pick once this passes). The figures say whether `runtime/compiler.py` may let auto pick CUDA graphs."""
    job = [*(QUICK_JOB if jobs.quick else GPU_JOB), "precision=bf16"]
    one = jobs.run([*job, "train.batch_size=32" if not jobs.quick else "train.grad_accum=2", "train.compile=off"])
    shared = {"PIPELINE_SHARE_GPU": "1"}
    auto = jobs.run([*job, "train.compile=auto"], launcher="torchrun", nproc=2, env=shared)
    graphs = jobs.run([*job, "train.compile=reduce-overhead"], launcher="torchrun", nproc=2, env=shared)
    results = {"auto": compare(one, auto), "cuda_graphs": compare(one, graphs)}
    ranks = "1" if jobs.quick else "2"  # quick: the two ranks are the fallback's one process
    two_ranks = all(r["params"].get("resolved.world_size") == ranks for r in (auto, graphs))
    return {"pass": two_ranks and all(r["pass"] for r in results.values()), "two_ranks": two_ranks,
            "auto_picked": auto["params"].get("resolved.compile"),
            "auto_reason": auto["params"].get("resolved.compile_reason"), **results}


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


def check_deepspeed(jobs: Jobs) -> dict:
    """ZeRO-2 and ZeRO-3 in bf16 with train.compile=auto, one GPU under the deepspeed launcher."""
    if jobs.quick:
        return {"pass": True, "skipped": "quick: DeepSpeed's launcher on a CPU takes minutes"}
    from pipeline import names

    per_stage = {}
    for stage in (2, 3):
        result = jobs.run([*GPU_JOB, "precision=bf16", "train.compile=auto", f"deepspeed=ds_configs/zero{stage}.json"],
                          launcher="deepspeed")
        per_stage[f"zero{stage}"] = {"pass": result["ok"], "seconds": result["seconds"],
                                     "compile": result["params"].get("resolved.compile"),
                                     "compile_reason": result["params"].get("resolved.compile_reason"),
                                     "train_loss": result["metrics"].get(names.TRAIN_LOSS),
                                     "samples_per_s": result["metrics"].get(names.SAMPLES_PER_S),
                                     **({} if result["ok"] else {"log": result["log"]})}
    return {"pass": all(r["pass"] for r in per_stage.values()), **per_stage}


def check_pytest_gpu(jobs: Jobs) -> dict:
    """`pytest -m gpu` on 3 workers (the tests sharing jobs kept on one: --dist loadgroup), within
    PYTEST_GPU_S, less PYTEST_LEFT_OUT. Its figures are pass/fail only: nothing in it is timed."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/integration/test_gpu.py",
           *[f"--deselect={t}" for t in PYTEST_LEFT_OUT]]
    cmd = [*cmd, "--collect-only"] if jobs.quick else [*cmd, "-n", "3", "--dist", "loadgroup"]
    ok, log = run_command(cmd, jobs.logs / "pytest.log", timeout=PYTEST_GPU_S)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|"
                                                     r"tests? collected)", log)}
    return {"pass": ok, "counts": counts, "log": log[-1500:]}


def check_demo(jobs: Jobs) -> dict:
    """The GPU demo with one seed: FP32 vs AMP at BERT-base size, its report written."""
    cmd = [sys.executable, "-m", "pipeline", "study", "launch/studies/demo-gpu-check.yaml",
           f"tracking.uri=sqlite:///{jobs.work / 'demo.db'}"]
    start = time.perf_counter()
    ok, log = run_command([*cmd, "--dry-run"] if jobs.quick else cmd, jobs.logs / "demo.log")
    return {"pass": ok, "seconds": round(time.perf_counter() - start, 1), "log": log[-1500:]}


EAGER_JOB_S, COMPILED_JOB_S = 45, 90
"""One H100: a tiny `python -m pipeline train` job's wall seconds, start-up and evaluation included
(the shipped config's eager job: 70 s wall for 26 s of training; compiled: 44 s more of compilation,
results/train-epochs6-h100-80gb-hbm3-2026-11-24.json)."""



CHECKS = [  # in the order of what they answer: the open questions first
    # 2 compiled cells at ~40 s of compilation, 2 eager ones, 3 s windows and profiles, 15 s of imports
    runner.Check("mfu", check_mfu, 130, alone=True),
    runner.Check("ddp", check_ddp, EAGER_JOB_S * 2 + COMPILED_JOB_S),
    # two BERT-base jobs of 4 epochs, fp32 eager and bf16 compiled (results/gpu-compile-...: 30-40 s)
    runner.Check("demo", check_demo, 200),
    runner.Check("pytest_gpu", check_pytest_gpu, PYTEST_GPU_S),
    # the last two share a lane by the estimates: mfu 130, then ddp 310, demo 330, pytest_gpu 340, and
    # fallback 265 followed by deepspeed 385 of the 390 s
    runner.Check("fallback", check_fallback, EAGER_JOB_S + COMPILED_JOB_S),
    runner.Check("deepspeed", check_deepspeed, 2 * (EAGER_JOB_S + 15)),  # auto is eager under DeepSpeed
]
BY_NAME = {c.name: c for c in CHECKS}


def run_checks(todo: list[runner.Check], report: runner.Report, work: Path, quick: bool, parallel: int,
               deadline: float) -> None:
    """Phase after phase (phases): each check in a child process, the side-by-side ones up to `parallel`
    at a time (in this process, one after another, when parallel is 1: quick); none started that its
    estimate says cannot finish by `deadline`, any still running at `deadline` stopped with its tree."""
    def child(check: runner.Check, part: Path) -> list[str]:
        return [sys.executable, __file__, "--child", check.name, "--work", str(work / check.name),
                "--out", str(report.out / check.name), "--part", str(part), *(["--quick"] if quick else [])]

    if parallel == 1:
        jobs = Jobs(work, quick, report.out)
        for check in todo:
            if not runner.too_late(check, report, deadline):
                jobs.logs = report.out / check.name  # as a child's: the check's logs in its own folder
                jobs.logs.mkdir(parents=True, exist_ok=True)
                report.add(check.name, runner.run_here(check, jobs))
        return
    for phase in runner.phases(todo):
        runner.children(phase, report, work, child, 1 if phase[0].alone else parallel, deadline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a CPU smoke run of this script (seconds, not a check)")
    parser.add_argument("--only", default=",".join(BY_NAME), help=f"comma-separated subset of {', '.join(BY_NAME)}")
    parser.add_argument("--budget", type=float, help=f"seconds the checks may take (default {BUDGET_S}; quick: none)")
    parser.add_argument("--parallel", type=int, help="side-by-side checks at a time (default 4; quick: 1)")
    parser.add_argument("--estimates", type=Path, help="a previous run's JSON: its check_seconds as the estimates")
    parser.add_argument("--out", type=Path, help="the folder of everything it writes (default: "
                                                 "benchmarks/results/gpu-check-MACHINE-DATE/)")
    parser.add_argument("--work", type=Path, help="the jobs' outputs and MLflow store (default: a new temp folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one check, its result to --part (run_checks' children)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
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
    if opts.child:
        opts.out.mkdir(parents=True, exist_ok=True)
        result = BY_NAME[opts.child].run(Jobs(work, opts.quick, opts.out))
        opts.part.write_text(json.dumps(result, default=str))
        return 0
    unknown = [n for n in opts.only.split(",") if n not in BY_NAME]
    if unknown:
        print(f"gpu_check: --only {','.join(unknown)}: no such check ({', '.join(BY_NAME)})", file=sys.stderr)
        return 2
    estimates = {c.name: c.estimate_s for c in CHECKS}
    if opts.estimates:
        measured = json.loads(opts.estimates.read_text())["checks"]
        estimates.update({n: c["check_seconds"] for n, c in measured.items() if "check_seconds" in c})
    budget = opts.budget if opts.budget is not None else (float("inf") if opts.quick else BUDGET_S)
    parallel = opts.parallel or (1 if opts.quick else 4)
    todo, not_run = runner.plan([c for c in CHECKS if c.name in opts.only.split(",")], estimates, budget, parallel)
    head = {"benchmark": "gpu-check", "quick": opts.quick, "machine": machine(),
            "budget_s": None if budget == float("inf") else budget,
            "parallel": parallel, "estimates_s": estimates, "run": [c.name for c in todo],
            "tolerances": {"loss_rtol": LOSS_RTOL, "score_atol": SCORE_ATOL, "energy_ratio": ENERGY_RATIO}}
    report = runner.Report(opts.out or result_path("gpu-check").with_suffix(""), head, estimates, not_run)
    report.write()  # the plan, before any check: a kill at once still leaves what would have run
    runner.stop_children_on_sigterm(report)
    run_checks(todo, report, work, opts.quick, parallel, time.monotonic() + budget)
    report.write()
    left = f" (not run: {', '.join(report.not_run)})" if report.not_run else ""
    print(f"{'all pass' if report.passed else 'FAILED'}{left}: {report.json}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
