"""bf16 AMP vs FP32 training throughput through the pipeline: same model, batch, lengths.

(Peak memory is left out on CPU: the process's peak RSS only grows across in-process runs.)
Target: >= 1.4x on a CPU with AMX/AVX512-BF16 (a bare loop gives about 1.4-1.6x there).
    python benchmarks/bench_amp.py [--reps 3] [--steps 40]
"""
from common import alternate, long_sentiment_file, median, parser, pipeline_run, quiet, ratio, save


def main():
    options = parser(__doc__)
    options.add_argument("--steps", type=int, default=40)
    args = options.parse_args()
    quiet()
    common = [f"train.max_steps={args.steps}", f"train.batch_size={args.batch_size}",
              f"train.max_length={args.max_length}", "train.log_every=1000"]
    comments = f"data.train={long_sentiment_file()}"  # long-tailed lengths, median ~40 tokens
    samples = ["data.dev=samples", "data.test=samples"]  # evaluated on the built-in sets: only the speed is compared
    models = {  # the default Bangla model and the MiniLM architecture on the same comments, and
        # MiniLM on its WikiQA sample pairs (short: ~22 tokens)
        "bangla-small, sentiment comments": ["task=sentiment", "model=preset:bangla-small", comments, *samples],
        "all-MiniLM-L6-v2, sentiment comments": ["task=sentiment", "model=sentence-transformers/all-MiniLM-L6-v2",
                                                 comments, *samples],
        "all-MiniLM-L6-v2, WikiQA pairs": ["task=wikiqa", "model=sentence-transformers/all-MiniLM-L6-v2"],
    }
    rows, runs = [], {}
    for model, overrides in models.items():
        print(f"{model}: fp32 vs bf16, {args.reps} reps of {args.steps} steps")
        result = alternate({prec: (lambda prec=prec, overrides=overrides:
                                   pipeline_run([*overrides, *common, f"precision={prec}"]))
                            for prec in ("fp32", "bf16")}, args.reps)
        runs[model] = result
        key = "perf/train_samples_per_s"
        speedup = ratio(result["bf16"], result["fp32"], key)
        rows.append({"model": model, "fp32 samples/s": median(result["fp32"], key),
                     "bf16 samples/s": median(result["bf16"], key), "bf16/fp32": speedup,
                     "target >= 1.4x": "met" if speedup >= 1.4 else "missed"})
    save("amp", rows, list(rows[0]), vars(args), runs)


if __name__ == "__main__":
    main()
