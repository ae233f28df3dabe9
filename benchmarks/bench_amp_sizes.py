"""What bf16 autocast gives a training step on this CPU, per model size and sequence length.

Each cell builds one preset-shaped BERT classifier (pipeline/models.py's PRESETS, the preset
vocabulary) and times training steps on fixed-length batches of random tokens, fp32 and bf16
autocast alternating step by step in this one process (A B A B ...): a machine busy with other
work slows both alike, so the ratio of the medians is the precision's, not the load's. The
demo's AMP cells are chosen from this table (launch/studies/demo.yaml).
    python benchmarks/bench_amp_sizes.py [--steps 12] [--batch-size 32]
"""
from __future__ import annotations

import statistics
import time

import torch

from common import bare_step, parser, quiet, save

SIZES = ("bangla-tiny", "bangla-small", "bangla-base")
LENGTHS = (32, 64, 128)


def build(size: str):
    from transformers import BertConfig, BertForSequenceClassification

    from pipeline.models import PRESET_VOCAB, PRESETS

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=PRESET_VOCAB, num_labels=3, **PRESETS[size]))
    return model.train(), torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False)


def batch(batch_size: int, length: int) -> dict:
    from pipeline.models import PRESET_VOCAB

    return {"input_ids": torch.randint(5, PRESET_VOCAB, (batch_size, length)),
            "attention_mask": torch.ones(batch_size, length, dtype=torch.long),
            "labels": torch.randint(0, 3, (batch_size,))}


def step_times(size: str, length: int, batch_size: int, steps: int) -> dict[str, list[float]]:
    model, optimizer = build(size)
    data = batch(batch_size, length)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i in range(steps + 2):  # the first round of each warms its kernels up
        for precision in (("fp32", "bf16") if i % 2 else ("bf16", "fp32")):
            start = time.perf_counter()
            bare_step(model, optimizer, dict(data), precision)
            if i >= 2:
                times[precision].append(time.perf_counter() - start)
    return times


def main():
    options = parser(__doc__)
    options.add_argument("--steps", type=int, default=12)
    args = options.parse_args()
    quiet()
    rows = []
    for size in SIZES:
        for length in LENGTHS:
            times = step_times(size, length, args.batch_size, args.steps)
            fp32, bf16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
            row = {"model": size, "tokens": length, "fp32 step ms": round(1000 * fp32, 1),
                   "bf16 step ms": round(1000 * bf16, 1), "bf16 speed-up": round(fp32 / bf16, 3)}
            print(row, flush=True)
            rows.append(row)
    save("amp-sizes", rows, list(rows[0]), vars(args), {})


if __name__ == "__main__":
    main()
