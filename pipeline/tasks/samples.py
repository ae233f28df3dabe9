"""Deterministic built-in sample sets, written in each dataset's own file format.

No dataset content is copied from anywhere: sentences are composed from small word lists so
that labels are learnable, then a fixed fraction of labels is flipped (label noise) so the
scores are not trivially perfect. Files are generated on first use into the cache directory
(never committed) and read back through the task's real reader.
"""
from __future__ import annotations

import csv
import random
from collections.abc import Callable, Iterable
from pathlib import Path

from pipeline.fsutil import atomic_dir, cache_root

SAMPLE_VERSION = 1  # bump when a generator changes, so stale caches are not reused

BN_DIGITS = str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")

SUBJECTS = ["খাবার", "সিনেমা", "বই", "ফোন", "হোটেল", "সেবা", "গান", "দোকান", "রেস্তোরাঁ", "নাটক",
            "খেলা", "ক্যামেরা", "ডেলিভারি", "অ্যাপ", "বাস", "ট্রেন", "ল্যাপটপ", "জামা", "হাসপাতাল", "পার্ক"]
POSITIVE = ["ভালো", "চমৎকার", "দারুণ", "অসাধারণ", "সুন্দর", "মজার", "সেরা", "প্রশংসনীয়"]
NEGATIVE = ["খারাপ", "বাজে", "জঘন্য", "হতাশাজনক", "বিরক্তিকর", "নিম্নমানের", "ভয়ংকর", "অসহ্য"]
INTENSIFIERS = ["খুব", "সত্যিই", "একদম", "বেশ", "অনেক", ""]
OPENERS = ["", "", "আমার মনে হয়", "সত্যি বলতে", "গতকাল দেখলাম", "বন্ধুরা বলেছে", "আজ"]
ENDINGS = ["।", "।", "!", "", " ।"]


def ensure_samples(task_name: str, write: Callable[[Path], dict[str, Path]]) -> dict[str, Path]:
    """Generate the task's sample files once; concurrent ranks race safely (atomic rename)."""
    final = cache_root() / "samples" / f"{task_name}-v{SAMPLE_VERSION}"
    if not final.is_dir():
        with atomic_dir(final) as tmp:
            write(tmp)
    return {split: p for split in ("train", "dev", "test") if (p := _find(final, split))}


TSV = {"delimiter": "\t", "lineterminator": "\n"}
"""csv.writer options of the tab-separated sample files."""


def write_table(path: Path, header: list[str], rows: Iterable[list], **csv_options) -> Path:
    """One sample split as a CSV/TSV file: UTF-8, the header, then `rows` (csv.writer options)."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, **csv_options)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _find(directory: Path, split: str) -> Path | None:
    matches = sorted(directory.glob(f"{split}.*"))
    return matches[0] if matches else None


def sentiment_sentence(rng: random.Random, label: str) -> str:
    subj = rng.choice(SUBJECTS)
    inten = rng.choice(INTENSIFIERS)
    if label == "Positive":
        body = rng.choice([
            f"{subj}টা {inten} {rng.choice(POSITIVE)} ছিল",
            f"এই {subj} আমার {inten} পছন্দ হয়েছে",
            f"{subj} নিয়ে আমি {inten} খুশি",
            f"{subj}টা {rng.choice(NEGATIVE)} না, {rng.choice(POSITIVE)}",
            f"সবাইকে এই {subj} ব্যবহার করতে বলব, {rng.choice(POSITIVE)}",
        ])
    elif label == "Negative":
        body = rng.choice([
            f"{subj}টা {inten} {rng.choice(NEGATIVE)} ছিল",
            f"এই {subj} আমার একদম পছন্দ হয়নি",
            f"{subj} নিয়ে আমি {inten} হতাশ",
            f"{subj}টা {rng.choice(POSITIVE)} না",
            f"কাউকে এই {subj} নিতে বলব না, {rng.choice(NEGATIVE)}",
        ])
    else:
        price = str(rng.randint(20, 5000)).translate(BN_DIGITS)
        body = rng.choice([
            f"{subj} আজ বিকেলে পাওয়া যাবে",
            f"{subj}টা গতকাল কেনা হয়েছে",
            f"{subj} সম্পর্কে আরও তথ্য জানতে চাই",
            f"{subj}টার দাম {price} টাকা",
            f"আগামীকাল {subj} নিয়ে আলোচনা হবে",
        ])
    opener = rng.choice(OPENERS)
    text = f"{opener} {body}{rng.choice(ENDINGS)}".strip()
    return " ".join(text.split()) if rng.random() > 0.1 else text.replace(" ", "  ", 1)  # some messy spacing


def noisy(rng: random.Random, label: str, labels: list[str], rate: float) -> str:
    return rng.choice([l for l in labels if l != label]) if rng.random() < rate else label
