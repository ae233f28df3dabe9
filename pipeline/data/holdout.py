"""data.dev=holdout:F[:SEED]: a fraction of the prepared training split held out as the dev split.

The held-out rows are a seeded draw over the training split's rows (numpy's PCG64 from SEED, not
the job's seed: every seed of a study is judged on the same rows), so every rank, every resume and
every job that names the same file and fraction draws the same rows. A task whose rows come in
groups (Task.holdout_group: WikiQA's candidates of one question) draws whole groups, so a
question is ranked on all of its candidates and none of them is trained on. Both parts are
prepared-data entries of their own (features.shared_entry: built once per node, memory-mapped),
keyed by the training entry's key, F and SEED, so their features are cached apart from the whole
file's and from another draw's.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.data.features import FORMAT_VERSION, ExamplesDigest, features_dir, shared_entry, update_texts_hash
from pipeline.data.prepared import TEXT_BATCH, TrainRows
from pipeline.errors import UserError
from pipeline.fsutil import write_json
from pipeline.runtime.world import Runtime

if TYPE_CHECKING:
    from pipeline.tasks.base import Task


PART_FORMAT = 2
"""Bump when what a part's entry holds changes (2: the task's texts of its own rows), so an entry
built otherwise is never matched again."""


def held_out_rows(groups: Sequence, fraction: float, seed: int) -> np.ndarray:
    """The sorted row numbers held out: a seeded draw of round(fraction * G) of the rows' G groups
    (at least 1, fewer than all), every row of a drawn group. `groups`: each row's group."""
    _, group_of = np.unique(np.asarray(groups), return_inverse=True)
    count = int(group_of.max(initial=-1)) + 1
    drawn = np.random.default_rng(seed).permutation(count)[:min(max(1, round(fraction * count)), count - 1)]
    return np.flatnonzero(np.isin(group_of, drawn))


def hold_out(task: Task, train: TrainRows, fraction: float, seed: int, rt: Runtime) -> tuple[TrainRows, TrainRows]:
    """The training split without the held-out rows, and the held-out rows: two prepared entries."""
    by = task.holdout_group
    groups = train.dataset().select_columns([by])[by] if by else np.arange(len(train))
    distinct = len(set(groups))
    if distinct < 2:
        raise UserError(f"config: data.dev=holdout:{fraction}: the training split has {distinct} "
                        f"{f'distinct {by}' if by else 'row(s)'}; holding out needs 2 or more")
    held = held_out_rows(groups, fraction, seed)
    kept = np.setdiff1d(np.arange(len(train)), held)
    return _part(task, train, "kept", kept, fraction, seed, rt), _part(task, train, "held", held, fraction, seed, rt)


def _part(task: Task, train: TrainRows, part: str, rows: np.ndarray, fraction: float, seed: int,
          rt: Runtime) -> TrainRows:
    """One part of the training entry (`rows` of it) as an entry of its own."""
    key = hashlib.sha256(json.dumps({"of": train.key, "holdout": [fraction, seed], "by": task.holdout_group,
                                     "part": part, "format": PART_FORMAT}).encode()).hexdigest()[:32]
    final = features_dir() / f"examples-{key}"

    def build(tmp: Path) -> None:
        import datasets

        examples = train.dataset().select(rows)
        examples.save_to_disk(str(tmp / "examples"))
        # the part's texts as the task gives them for its rows: not one per row (QA's contexts,
        # WikiQA's questions), so not a selection of the whole split's texts
        digest, text_hash, pieces = ExamplesDigest(), hashlib.sha256(), []
        for batch in examples.iter(batch_size=TEXT_BATCH):
            chunk = [dict(zip(batch, values)) for values in zip(*batch.values())]
            digest.update(chunk)
            texts = task.texts(chunk)
            update_texts_hash(text_hash, texts)
            pieces.append(datasets.Dataset.from_dict({"text": texts}))
        texts = datasets.concatenate_datasets(pieces) if pieces else datasets.Dataset.from_dict({"text": []})
        texts.save_to_disk(str(tmp / "texts"))
        write_json(tmp / "meta.json", {"format": FORMAT_VERSION, "key": key, "rows": len(rows),
                                       "digest": digest.hexdigest(), "texts_sha256": text_hash.hexdigest(),
                                       "state": train.meta["state"], "holdout": [fraction, seed, part],
                                       "datasets": {"examples": len(rows), "texts": len(texts)}})

    meta, outcome = shared_entry(final, build, rt, f"train examples, {part} of holdout:{fraction}:{seed}",
                                 ("examples", "texts"))
    return TrainRows(final, meta, outcome)
