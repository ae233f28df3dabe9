"""Dotted config keys and the near-miss hint: what validation needs of the config dataclasses'
shape, apart from the reference (reference.py), which reads the schema whole. An unknown key that
a Hugging Face Trainer user would write (learning_rate, save_steps) is answered from the one table
of those names (trainer_names.py) before any guess by spelling."""
from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable
from typing import Any

from pipeline.config import trainer_names

NEAR = 0.6  # difflib's own default cutoff: below it, suggestions are mostly unrelated words


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass, sections included: train, train.lr, ..."""
    out: list[str] = []
    for f, kind in fields_of(cls):
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(kind):
            out += dotted_keys(kind, f"{prefix}{f.name}.")
    return out


def unknown_key_hint(key: str, keys: Iterable[str]) -> str:
    """The hint after an unknown dotted key: the key a Trainer user means (trainer_names.py), else
    the valid key nearest in spelling (did_you_mean), else ''."""
    return trainer_names.hint(key) or did_you_mean(key, keys)


def did_you_mean(word: str, candidates: Iterable[str], default: str | None = None) -> str:
    """' (did you mean X?)' naming the candidate(s) nearest to word, else ''. Dotted names are
    compared by their last part, first among word's siblings (train.batch_sise: train.batch_size),
    then among all candidates (lr: train.lr); an empty word gets the default, if one is given."""
    if not word.strip():
        return f" (leave the key out for its default, {default})" if default is not None else ""
    candidates = list(candidates)
    parent, _, leaf = word.rpartition(".")
    siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
    near = _nearest(leaf, siblings) or _nearest(leaf, [c for c in candidates if c != word])
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def _nearest(word: str, candidates: list[str]) -> list[str]:
    """The candidates whose last dotted part is nearest to word (ties all kept), if near enough."""
    scores = {c: difflib.SequenceMatcher(None, word.lower(), c.rpartition(".")[2].lower()).ratio()
              for c in candidates}
    best = max(scores.values(), default=0.0)
    return [c for c, score in scores.items() if score == best] if best >= NEAR else []


def fields_of(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]
