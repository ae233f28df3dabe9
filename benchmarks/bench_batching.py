"""Fixed max_length padding (as the paper did) vs dynamic padding vs dynamic padding with
length-grouped batches (train.group_by_length): tokens computed and training samples/s.

The sample sets are short sentences (median ~9 tokens), so this uses a long-tailed length
distribution typical of social-media text: log-normal, median --median tokens, capped at
--max-length (the real BLP-2023 distribution cannot be measured offline). The batches come
from the pipeline's own sampler (ResumableSampler) and collator; the step is the loop's step.
Each contender trains one whole epoch of --rows rows, so all three compute the same samples.
    python benchmarks/bench_batching.py [--reps 3] [--rows 640]
"""
import math
import time

import numpy as np
import torch
import transformers
from torch.utils.data import DataLoader

from common import alternate, bare_step, median, parser, quiet, ratio, save

MODEL = "preset:bangla-small"


def lengths_for(args) -> list[int]:
    rng = np.random.default_rng(0)
    drawn = rng.lognormal(mean=math.log(args.median), sigma=args.sigma, size=args.rows)
    return [int(min(max(4, round(x)), args.max_length)) for x in drawn]


def make_features(lengths, vocab_size):
    import datasets

    rng = np.random.default_rng(1)
    ids = [[2, *rng.integers(5, vocab_size, n - 2).tolist(), 3] for n in lengths]  # [CLS] ... [SEP]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * n for n in lengths],
                                       "labels": rng.integers(0, 3, len(lengths)).tolist(),
                                       "idx": list(range(len(lengths)))})


def train(strategy: str, args, features, lengths) -> dict:
    from pipeline import models
    from pipeline.data.loaders import ResumableSampler
    from pipeline.job.parts.optim import param_groups
    from pipeline.tasks import get_task

    task = get_task("sentiment")
    transformers.set_seed(0)
    tokenizer, model = models.build(MODEL, task, task.texts(task.load(None, "train")), {}, args.max_length)
    sampler = ResumableSampler(features, num_replicas=1, rank=0, shuffle=True, seed=0, batch_size=args.batch_size,
                               lengths=lengths if strategy == "dynamic + grouped" else None)
    collate = task.collator(tokenizer)
    if strategy == "fixed max_length":
        collate = transformers.DataCollatorWithPadding(tokenizer, padding="max_length", max_length=args.max_length)
    loader = DataLoader(features, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=3e-4)
    model.train()
    samples = computed = real = 0
    start = time.perf_counter()
    for batch in loader:
        bare_step(model, optimizer, batch, args.precision)
        samples += batch["input_ids"].shape[0]
        computed += batch["input_ids"].numel()
        real += int(batch["attention_mask"].sum())
    elapsed = time.perf_counter() - start
    return {"samples_per_s": samples / elapsed, "tokens_computed_per_sample": computed / samples,
            "real_token_share": real / computed}


def main():
    options = parser(__doc__, max_length=256)
    options.add_argument("--rows", type=int, default=640)
    options.add_argument("--median", type=float, default=40)
    options.add_argument("--sigma", type=float, default=0.8)
    args = options.parse_args()
    quiet()
    lengths = lengths_for(args)
    from pipeline import models
    from pipeline.tasks import get_task

    task = get_task("sentiment")
    tokenizer = models.preset_tokenizer(task.texts(task.load(None, "train")))
    features = make_features(lengths, vocab_size=len(tokenizer))
    spread = {f"p{q}": int(np.percentile(lengths, q)) for q in (5, 50, 95)}
    print(f"lengths {spread}, mean {np.mean(lengths):.1f}; {args.reps} reps of one epoch")
    strategies = ("fixed max_length", "dynamic", "dynamic + grouped")
    result = alternate({s: (lambda s=s: train(s, args, features, lengths)) for s in strategies}, args.reps)
    rows = [{"batching": s, "tokens computed / sample": median(result[s], "tokens_computed_per_sample"),
             "real-token share": median(result[s], "real_token_share"),
             "samples/s": median(result[s], "samples_per_s"),
             "speed-up vs fixed": ratio(result[s], result["fixed max_length"], "samples_per_s")} for s in strategies]
    save(f"batching-{args.precision}", rows, list(rows[0]), {**vars(args), "length_percentiles": spread}, result)


if __name__ == "__main__":
    main()
