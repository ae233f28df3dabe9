"""What a distilled student buys at inference: the demo's WikiQA teacher (all-MiniLM-L6-v2, 6 layers)
against its 2-layer students (kd_fp32, kd_amp) and the baseline (the same 2 layers trained without
distillation), measured as every stage measures its best model (pipeline/measure/inference.py):
batch-1 latency p50/p95 and throughput at the serving batch, on token tensors already on the device,
warm-up excluded, in fp32, at the test split's median length and its longest bucket.

The models are the demo's best/ directories (`make demo`, or the KD cells of launch/studies/demo.yaml:
outputs/demo/wikiqa-PROCEDURE-sSEED). Per repetition every model is measured once, in rotating
order; a speed-up is the median over repetitions of (model / teacher) in that repetition, seeds
averaged, so a shared machine's drift cancels.
    python benchmarks/bench_inference.py [--reps 3] [--threads 1] [--lengths 22,32] [--outputs outputs/demo]
"""
import statistics
from pathlib import Path

import torch

from common import ROOT, alternate, parser, quiet, save

PROCEDURES = ("teacher", "baseline", "kd_fp32", "kd_amp")


def main() -> None:
    p = parser(__doc__, reps=3, batch_size=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the issue's hand timing used one)")
    p.add_argument("--lengths", default="22,32", help="median,longest of the WikiQA sample test split "
                                                      "(a demo stage's infer/length/*)")
    p.add_argument("--outputs", default=str(ROOT / "outputs" / "demo"))
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--budget-s", type=float, default=6.0, help="timed seconds per model and repetition")
    args = p.parse_args()
    quiet()
    from pipeline.measure import inference
    from pipeline.models import SavedModel

    torch.set_num_threads(args.threads)
    median_len, longest_len = (int(x) for x in args.lengths.split(","))
    lengths = {"median": median_len, "longest": longest_len}
    models = {f"{proc}-s{seed}": SavedModel(str(Path(args.outputs) / f"wikiqa-{proc}-s{seed}"))
              for proc in PROCEDURES for seed in args.seeds.split(",")}

    def measure(m: SavedModel):
        def run() -> dict:
            r = inference.bench(m.served(), torch.device("cpu"), lengths=lengths, precisions=["fp32"],
                                batch_size=args.batch_size, budget_s=args.budget_s)
            out = {"params": r.params, "params_no_embed": r.params_no_embed, "size_mb": r.size_mb}
            for x in r.measurements:
                out.update({f"{x.length_name}_p50_ms": x.latency_ms_p50, f"{x.length_name}_p95_ms": x.latency_ms_p95,
                            f"{x.length_name}_samples_per_s": x.samples_per_s,
                            f"{x.length_name}_peak_rss_mb": x.peak_mem_mb})
            return out
        return run

    runs = alternate({name: measure(m) for name, m in models.items()}, args.reps)
    rows = []
    for proc in PROCEDURES:
        mine = [n for n in runs if n.startswith(proc + "-")]
        teacher = [n for n in runs if n.startswith("teacher-")]
        for length in lengths:
            def per_rep(names: list[str], key: str, rep: int) -> float:
                return statistics.mean(runs[n][rep][key] for n in names)

            reps = range(args.reps)
            row = {"procedure": proc, "length": lengths[length], "params_M": runs[mine[0]][0]["params"] / 1e6,
                   "no_embed_M": runs[mine[0]][0]["params_no_embed"] / 1e6, "size_mb": runs[mine[0]][0]["size_mb"],
                   "p50_ms": statistics.median(per_rep(mine, f"{length}_p50_ms", r) for r in reps),
                   "p95_ms": statistics.median(per_rep(mine, f"{length}_p95_ms", r) for r in reps),
                   "samples_per_s": statistics.median(per_rep(mine, f"{length}_samples_per_s", r) for r in reps),
                   "latency_x": statistics.median(per_rep(teacher, f"{length}_p50_ms", r)
                                                  / per_rep(mine, f"{length}_p50_ms", r) for r in reps),
                   "throughput_x": statistics.median(per_rep(mine, f"{length}_samples_per_s", r)
                                                     / per_rep(teacher, f"{length}_samples_per_s", r) for r in reps),
                   "peak_rss_mb": statistics.median(per_rep(mine, f"{length}_peak_rss_mb", r) for r in reps)}
            rows.append(row)
    save(f"inference-wikiqa-threads{args.threads}", rows,
         ["procedure", "length", "params_M", "no_embed_M", "size_mb", "p50_ms", "p95_ms", "samples_per_s",
          "latency_x", "throughput_x", "peak_rss_mb"],
         {"reps": args.reps, "threads": args.threads, "batch_size": args.batch_size, "lengths": lengths,
          "budget_s": args.budget_s, "outputs": args.outputs, "seeds": args.seeds}, runs)


if __name__ == "__main__":
    main()
