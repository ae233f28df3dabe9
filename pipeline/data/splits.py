"""A stage's splits, assembled one way for whoever needs them: the stage itself (job/stage.py), a
finished stage read back (tracking/finished_stage.py: export's check) and the benchmarks, so all of
them see the same rows and the same features.

Rows first, features later: a preset's tokenizer is trained on the training texts (models.build),
so it exists only between the two. The training split is prepared once per node and memory-mapped
(its size, digest and texts, not its rows); data.dev=holdout:F[:SEED] holds a draw of it out as
the dev split (holdout.py); dev and test are read from their sources and keep their examples (the
metrics read them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.config import DataConfig
from pipeline.data import features, holdout
from pipeline.data.prepared import PreparedFeatures, TrainRows
from pipeline.runtime.world import Runtime
from pipeline.tasks.base import SPLITS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pipeline.tasks.base import Task


@dataclass(frozen=True)
class Splits:
    """The rows of a stage's splits, before any tokenizer (read_splits)."""

    task: Task
    data: DataConfig
    rt: Runtime
    examples: dict[str, TrainRows | list[dict]]
    """Split -> its examples: the prepared training rows; a held-out dev's rows as examples; dev and
    test as read (what the metrics read)."""
    rows: dict[str, TrainRows | list[dict]]
    """Split -> what its features are made from: a prepared entry (train, a held-out dev) or its
    examples."""

    def features(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, PreparedFeatures]:
        """Each split's features through `tokenizer`, truncated at `max_length`, in SPLITS order
        (prepared entries: built once per node, memory-mapped)."""
        return {split: features.prepare_features(self.task, split,
                                                 self.data.source(split) if self.data.reads(split) else None,
                                                 self.rows[split], tokenizer, max_length, self.rt)
                for split in SPLITS if split in self.rows}


def read_splits(task: Task, data: DataConfig, rt: Runtime, wanted: tuple[str, ...] = SPLITS) -> Splits:
    """The rows of those of the `wanted` splits the stage has: a split it does not have
    (data.dev=skip, no data.test) has no entry. The training split is prepared where it is wanted
    or a dev split is held out of it."""
    held_out = data.holdout() if "dev" in wanted else None
    rows: dict[str, TrainRows | list[dict]] = {}
    if "train" in wanted or held_out is not None:
        rows["train"] = features.prepare_train(task, data.source("train"), rt)
        if held_out is not None:  # dev: rows of the training file, trained on no more
            rows["train"], rows["dev"] = holdout.hold_out(task, rows["train"], *held_out, rt)
    read = {split: task.load(data.source(split), split) for split in ("dev", "test")
            if split in wanted and data.reads(split)}
    examples = {**({"train": rows["train"]} if "train" in wanted else {}), **read,
                **({"dev": rows["dev"].examples()} if "dev" in rows else {})}
    rows = {split: rows.get(split, examples[split]) for split in examples}
    return Splits(task, data, rt, examples, rows)
