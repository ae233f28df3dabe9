"""Data preparation (pipeline/data/features.py): a sentiment training file of generated rows prepared
cold (empty cache: read, validate, normalize, train the preset tokenizer, tokenize, save) and warm
(the same fingerprint: memory-map), by 1 and by 2 ranks (torchrun, gloo), at 10k, 100k and 1M
rows; beside it the in-memory path without the prepared cache (read + normalize + tokenize in
every rank, one process). Each measurement is its own process (its own peak RSS); the time is what
build_stage spends on data (training examples, the preset tokenizer, features of train/dev/test),
measured from a barrier to the slowest rank's end, imports and process start excluded.

Per rank: peak RSS (VmHWM) minus the RSS before preparing (the libraries), i.e. what preparing
the data added, and the anonymous (heap) RSS at the end, which a memory-mapped split does not
grow; the normalizer's worker processes are reported apart (their peak).
    python benchmarks/bench_data_prep.py [--rows 10000 100000 1000000] [--reps 2] [--in-memory-max 100000]
"""
import argparse
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, WORK, alternate, median, quiet, save

TASK = "sentiment"
MAX_LENGTH = 128


def generated_file(rows: int, seed: int = 0) -> Path:
    """A BLP-2023 TSV of `rows` comments of 1-4 generated sentences (median ~20 words)."""
    from pipeline.tasks import samples
    from pipeline.tasks.sentiment import LABELS

    path = WORK / f"train-{rows}.tsv"
    if path.exists():
        return path
    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        label = rng.choice(LABELS)
        text = " ".join(samples.sentiment_sentence(rng, label) for _ in range(rng.randint(1, 4)))
        lines.append([f"gen-{i:07d}", text, label])
    samples.write_table(path, ["id", "text", "label"], lines, **samples.TSV)
    return path


def eval_files() -> tuple[Path, Path]:
    """dev/test: the built-in sample set's, copied once (small and fixed at every size)."""
    from pipeline.tasks import get_task, samples

    task = get_task(TASK)
    found = samples.ensure_samples(TASK, task.write_samples)
    copies = []
    for split in ("dev", "test"):
        copy = WORK / f"{split}.tsv"
        if not copy.exists():
            shutil.copy(found[split], copy)
        copies.append(copy)
    return copies[0], copies[1]


# ---------------------------------------------------------------------- one measurement (a process per rank)


def memory() -> dict:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(status[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


class HeapPeak:
    """The highest anonymous RSS (heap: what cannot be dropped under memory pressure, unlike the
    pages of memory-mapped files that VmHWM also counts), sampled every 20 ms in a thread."""

    def __init__(self):
        self.peak = memory()["RssAnon"]
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, memory()["RssAnon"])
            time.sleep(0.02)

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return max(self.peak, memory()["RssAnon"])


def probe(args) -> None:
    """Prepare the data as build_stage does (`prepared`) or in every rank's own memory, without the
    cache (`in-memory`); this rank's figures to OUT/rank-R.json."""
    import torch.distributed as torch_dist

    from pipeline.data import features
    from pipeline.models import preset_tokenizer
    from pipeline.runtime import collectives, world
    from pipeline.tasks import get_task
    from pipeline.tasks import workers as base
    from pipeline.tasks.text_classification import TextClassificationTask

    rt = world.init("ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "single")
    task = get_task(TASK)
    calls = []
    featurize = TextClassificationTask.featurize
    TextClassificationTask.featurize = lambda self, *a: calls.append(a[-1]) or featurize(self, *a)
    specs = {"train": args.train, "dev": args.dev, "test": args.test}
    before = memory()
    heap = HeapPeak()
    collectives.barrier()
    start = time.perf_counter()
    if args.mode == "prepared":
        train = features.prepare_train(task, specs["train"], rt)
        tokenizer = preset_tokenizer(train.texts)
        prepared = {split: features.prepare_features(task, split, specs[split], train if split == "train" else
                                                     task.load(specs[split], split), tokenizer, MAX_LENGTH, rt)
                    for split in specs}
        train.release()
    else:
        base.PARALLEL_ROWS = 10**12  # the in-memory path: normalization and tokenization in this process
        examples = {split: task.load(specs[split], split) for split in specs}
        tokenizer = preset_tokenizer(task.texts(examples["train"]))
        prepared = {split: task.featurize(examples[split], tokenizer, MAX_LENGTH, split) for split in specs}
    seconds = time.perf_counter() - start
    heap_peak = heap.stop()
    after = memory()
    figures = {"rank": rt.rank, "seconds": seconds, "built": calls, "rows": len(prepared["train"]),
               "rss_before_mib": before["VmRSS"], "peak_added_mib": after["VmHWM"] - before["VmRSS"],
               "anon_added_mib": after["RssAnon"] - before["RssAnon"], "file_rss_mib": after["RssFile"],
               "heap_peak_added_mib": heap_peak - before["RssAnon"],
               "workers_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    Path(args.probe, f"rank-{rt.rank}.json").write_text(json.dumps(figures))
    if torch_dist.is_initialized():
        torch_dist.barrier()
    world.shutdown()


def measure(ranks: int, mode: str, train: Path, cache: Path) -> dict:
    """One preparation by `ranks` processes with PIPELINE_CACHE=cache: the slowest rank's time,
    who tokenized, and each rank's memory."""
    out = Path(WORK / f"probe-{time.time_ns()}")
    out.mkdir()
    dev, test = eval_files()
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={ranks}"]
    env = {**os.environ, "PIPELINE_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([*launcher, __file__, "--probe", str(out), "--mode", mode, "--train", str(train),
                    "--dev", str(dev), "--test", str(test)], cwd=ROOT, env=env, check=True)
    per_rank = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])
    return {"seconds": max(r["seconds"] for r in per_rank), "ranks": per_rank,
            "builders": sum(bool(r["built"]) for r in per_rank),
            "peak_added_mib": [r["peak_added_mib"] for r in per_rank],
            "anon_added_mib": [r["anon_added_mib"] for r in per_rank],
            "heap_peak_added_mib": [r["heap_peak_added_mib"] for r in per_rank]}


def cold_and_warm(ranks: int, train: Path) -> dict:
    cache = Path(WORK / f"cache-{time.time_ns()}")
    cold = measure(ranks, "prepared", train, cache)
    warm = measure(ranks, "prepared", train, cache)
    shutil.rmtree(cache, ignore_errors=True)
    return {"cold_s": cold["seconds"], "warm_s": warm["seconds"], "warm_share": warm["seconds"] / cold["seconds"],
            "cold": cold, "warm": warm}


def in_memory(ranks: int, train: Path) -> dict:
    cache = Path(WORK / f"cache-{time.time_ns()}")
    run = measure(ranks, "in-memory", train, cache)
    shutil.rmtree(cache, ignore_errors=True)
    return {"cold_s": run["seconds"], "run": run}


def rows_of(rows: int, ranks: int, runs: list[dict]) -> dict:
    cold = [r["cold"] for r in runs]
    warm = [r["warm"] for r in runs]
    return {"rows": rows, "ranks": ranks, "cold s": median(runs, "cold_s"), "warm s": median(runs, "warm_s"),
            "warm / cold": median(runs, "warm_share"), "cold rows/s": rows / median(runs, "cold_s"),
            "ranks that tokenized (cold)": max(c["builders"] for c in cold),
            "ranks that tokenized (warm)": max(w["builders"] for w in warm),
            "cold peak added MiB (per rank)": [round(statistics.median(c["peak_added_mib"][i] for c in cold))
                                               for i in range(ranks)],
            "cold heap peak added MiB (per rank)": [round(statistics.median(c["heap_peak_added_mib"][i] for c in cold))
                                                    for i in range(ranks)],
            "warm peak added MiB (per rank)": [round(statistics.median(w["peak_added_mib"][i] for w in warm))
                                               for i in range(ranks)],
            "warm heap added MiB (per rank)": [round(statistics.median(w["anon_added_mib"][i] for w in warm))
                                               for i in range(ranks)]}


def measure_size(rows: int, args, table: list[dict]) -> dict:
    """Cold and warm by 1 and 2 ranks (alternated), then the in-memory path up to --in-memory-max."""
    started = time.perf_counter()
    train = generated_file(rows)
    print(f"{rows} rows: file of {train.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - started:.0f} s",
          flush=True)
    reps = args.reps if rows < 1_000_000 else 1
    contenders = {f"{n} rank{'s' if n > 1 else ''}": functools.partial(cold_and_warm, n, train) for n in (1, 2)}
    result = alternate(contenders, reps)
    for n, name in enumerate(contenders, start=1):
        table.append(rows_of(rows, n, result[name]))
    if rows <= args.in_memory_max:
        old = alternate({f"in-memory {n}": functools.partial(in_memory, n, train) for n in (1, 2)}, reps)
        for n, name in enumerate(old, start=1):
            def per_rank(key):
                return [round(statistics.median(r["run"][key][i] for r in old[name])) for i in range(n)]  # noqa: B023
            table.append({"rows": rows, "ranks": n, "path": "in-memory (before)", "cold s": median(old[name], "cold_s"),
                          "cold rows/s": rows / median(old[name], "cold_s"), "ranks that tokenized (cold)": n,
                          "cold peak added MiB (per rank)": per_rank("peak_added_mib"),
                          "cold heap peak added MiB (per rank)": per_rank("heap_peak_added_mib")})
        result.update(old)
    return result


def main():
    options = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    options.add_argument("--reps", type=int, default=2)
    options.add_argument("--in-memory-max", type=int, default=100_000,
                         help="the old in-memory path only up to this many rows (it is slow and large)")
    options.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one measurement, one rank
    for name in ("mode", "train", "dev", "test"):
        options.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = options.parse_args()
    quiet()
    if args.probe:
        return probe(args)
    table, runs = [], {}
    for rows in args.rows:
        result = measure_size(rows, args, table)
        runs[str(rows)] = result
    for row in table:
        row.setdefault("path", "prepared (cached)")
    columns = ["rows", "ranks", "path", "cold s", "warm s", "warm / cold", "cold rows/s", "ranks that tokenized (cold)",
               "ranks that tokenized (warm)", "cold peak added MiB (per rank)", "cold heap peak added MiB (per rank)",
               "warm peak added MiB (per rank)", "warm heap added MiB (per rank)"]
    save("data_prep", table, columns, {**vars(args), "task": TASK, "max_length": MAX_LENGTH,
                                       "note": "2-core machine whose speed drifts from run to run; times are "
                                               "medians of alternated repetitions (1 at 1M rows)"}, runs)


if __name__ == "__main__":
    main()
