"""What the sample-set generators share: seeded draws (a Zipf-like word, a noisy label), Bangla
digits, and the CSV/TSV writer of a split."""
from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BN_DIGITS = str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")

TSV = {"delimiter": "\t", "lineterminator": "\n"}
"""csv.writer options of the tab-separated sample files."""


def write_table(path: Path, header: Sequence[str], rows: Iterable[list], **csv_options: Any) -> Path:
    """One sample split as a CSV/TSV file: UTF-8, the header, then `rows` (csv.writer options)."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, **csv_options)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def noisy(rng: random.Random, label: str, labels: Sequence[str], rate: float) -> str:
    return rng.choice([l for l in labels if l != label]) if rng.random() < rate else label


def zipf(rng: random.Random, words: Sequence[str], skew: float = 1.2) -> str:
    """A word drawn with Zipf-like weights 1/rank^skew: the first words are common, the last
    ones rare (a few occurrences per thousand sentences), as in real text."""
    return rng.choices(words, weights=[1 / (rank + 1) ** skew for rank in range(len(words))])[0]
