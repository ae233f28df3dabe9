"""Deterministic built-in sample sets, written in each dataset's own file format.

No dataset content is copied from anywhere: sentences are composed from small word lists and a
small grammar written for this project. Their difficulty comes from language-like structure,
not from flipped labels alone: several weak, overlapping cues per example (a contrast clause
that overrides the first opinion, negation that flips polarity, neutral sentences that mention
opinion words), and a long-tailed vocabulary, so a few words are seen only a handful of times
in training. A model then lands below the ceiling on examples it half-learned, and different
seeds and precisions miss different ones. A small share of labels is still flipped (noise).
Files are generated on first use into the cache directory (never committed) and read back
through the task's real reader.

One module per task holds its generator (word lists, grammar, rows, `write`); common.py what they
share. The package exports ensure_samples, the writing helpers and the sentiment comment grammar,
with which tests and benchmarks compose sentiment files of their own.

Inside, lowest first: common | error_cls ner qa sentiment wikiqa
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.fsutil import atomic_dir, cache_root
from pipeline.tasks.samples.common import BN_DIGITS, TSV, noisy, write_table, zipf
from pipeline.tasks.samples.sentiment import sentiment_sentence

__all__ = ["BN_DIGITS", "SAMPLE_VERSION", "TSV", "ensure_samples", "noisy", "sentiment_sentence", "write_table",
           "zipf"]

SAMPLE_VERSION = 3  # bump when a generator changes, so stale caches are not reused


def ensure_samples(task_name: str, write: Callable[[Path], dict[str, Path]]) -> dict[str, Path]:
    """Generate the task's sample files once; concurrent ranks race safely (atomic rename)."""
    final = cache_root() / "samples" / f"{task_name}-v{SAMPLE_VERSION}"
    if not final.is_dir():
        with atomic_dir(final) as tmp:
            write(tmp)
    return {split: p for split in ("train", "dev", "test") if (p := _find(final, split))}


def _find(directory: Path, split: str) -> Path | None:
    matches = sorted(directory.glob(f"{split}.*"))
    return matches[0] if matches else None
