"""Where a training step's time goes through the pipeline, fp32 vs bf16: the phases of the real
loop timed in place (data: fetching rows and collating; forward; backward; the optimizer step:
clipping, AdamW, zeroing; the rest of the loop), and torch.profiler's busiest operators.

The default config (`train task=sentiment`: bangla-small, batch 16, the sample set's one-sentence
comments) and, with --data long, the long-tailed real-length comments of common.long_sentiment_file.
    python benchmarks/profile_step.py [--steps 60] [--data default|long] [--reps 3]
"""
import contextlib
import time
from collections import defaultdict

import torch

from common import alternate, long_sentiment_file, median, pipeline_run, quiet, ratio, save

PHASES = ("data", "forward", "backward", "optimizer step", "loop rest")


class PhaseClock:
    """Seconds per phase, timed by wrapping the loop's own functions (no copy of the loop)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.cpu = defaultdict(float)
        """CPU seconds of this process per phase: on a shared machine, the work itself, not the wait for a core."""
        self.epoch = self.epoch_cpu = 0.0
        self.profiler = None

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.profiler.record_function(f"phase: {name}"):
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds[name] += time.perf_counter() - t0
                    self.cpu[name] += time.process_time() - c0
        return timed

    @contextlib.contextmanager
    def installed(self):
        from pipeline.job import loop as job_loop
        from pipeline.runtime import torch_backend

        saved = {"train_epoch": job_loop.train_epoch, "build_loaders": job_loop.build_loaders,
                 "fb": job_loop.forward_backward, "backward": torch_backend.TorchBackend.backward,
                 "step": torch_backend.TorchBackend.step}

        def loaders(features, collate, *args, **kwargs):
            return saved["build_loaders"](features, self.wrap("collate", collate), *args, **kwargs)

        def epoch(*args):
            t0, c0 = time.perf_counter(), time.process_time()
            with self.profiler if self.profiler is not None else contextlib.nullcontext():
                saved["train_epoch"](*args)
            self.epoch += time.perf_counter() - t0
            self.epoch_cpu += time.process_time() - c0

        job_loop.train_epoch, job_loop.build_loaders = epoch, loaders
        job_loop.forward_backward = self.wrap("forward+backward", saved["fb"])
        torch_backend.TorchBackend.backward = self.wrap("backward", saved["backward"])
        torch_backend.TorchBackend.step = self.wrap("optimizer step", saved["step"])
        try:
            yield self
        finally:
            job_loop.train_epoch, job_loop.build_loaders, job_loop.forward_backward = (
                saved["train_epoch"], saved["build_loaders"], saved["fb"])
            torch_backend.TorchBackend.backward, torch_backend.TorchBackend.step = saved["backward"], saved["step"]

    def shares(self, steps: int) -> dict:
        """Milliseconds per step of each phase, wall and CPU (the rest: the epoch less the phases)."""
        out = {}
        for kind, seconds, epoch in (("", self.seconds, self.epoch), ("cpu ", self.cpu, self.epoch_cpu)):
            parts = {"collate": seconds["collate"], "forward": seconds["forward+backward"] - seconds["backward"],
                     "backward": seconds["backward"], "optimizer step": seconds["optimizer step"]}
            parts["loop rest"] = epoch - sum(parts.values())
            parts["step"] = epoch
            out |= {f"{kind}{k} ms": 1000 * v / steps for k, v in parts.items()}
        out["cpu samples_per_s"] = out["samples_per_s"] = 0.0  # filled by one_run
        return out


def one_run(overrides, steps, profile=False) -> dict:
    clock = PhaseClock()
    if profile:
        clock.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with clock.installed():
        figures = pipeline_run([*overrides, f"train.max_steps={steps}", "train.log_every=1000"])
    out = clock.shares(steps)
    out["samples_per_s"] = figures["perf/train_samples_per_s"]
    out["cpu samples_per_s"] = out["samples_per_s"] * out["step ms"] / out["cpu step ms"]
    if profile:
        table = clock.profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
        out["profile"] = table
    return out


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--data", default="default", choices=["default", "long"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = [f"data.train={long_sentiment_file()}",
            "data.dev=samples", "data.test=samples"] if args.data == "long" else []
    base = ["task=sentiment", f"train.batch_size={args.batch_size}", *data]
    result = alternate({prec: (lambda prec=prec: one_run([*base, f"precision={prec}"], args.steps))
                        for prec in ("fp32", "bf16")}, args.reps)
    profiles = {prec: one_run([*base, f"precision={prec}"], min(args.steps, 15), profile=True)["profile"]
                for prec in ("fp32", "bf16")}
    for prec, table in profiles.items():
        print(f"\n{prec}: busiest operators\n{table}")
    rows = []
    for prec, runs in result.items():
        row = {"precision": prec}
        row.update({k: median(runs, k) for k in runs[0] if k.endswith(("ms", "samples_per_s"))})
        rows.append(row)
    ratios = [f"bf16/fp32 {key}" for key in ("samples_per_s", "cpu samples_per_s")]
    for name in ratios:
        rows[1][name] = ratio(result["bf16"], result["fp32"], name.removeprefix("bf16/fp32 "))
    threads = f"-threads{args.threads}" if args.threads else ""  # none: torch's default
    save(f"profile-step-{args.data}{threads}", rows, list(rows[0]) + ratios, vars(args),
         {"runs": result, "profiles": profiles})


if __name__ == "__main__":
    main()
