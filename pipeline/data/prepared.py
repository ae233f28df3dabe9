"""What features.prepare_train and features.prepare_features return: memory-mapped views of a
prepared-data entry, with the facts about it the stage reads (size, digest, key, hit or miss)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

TEXT_BATCH = 10_000


class TextColumn:
    """The training texts, read batch by batch from the memory-mapped entry: iterable any number
    of times (a preset's tokenizer hashes them, then trains on them) without a list of them all."""

    def __init__(self, dataset: datasets.Dataset, sha256: str | None = None):
        self.dataset = dataset
        self.sha256 = sha256
        """sha256 of the texts, each followed by a NUL byte (what preset_tokenizer hashes), as
        computed when the entry was built; None for an entry without it."""

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[str]:
        for batch in self.dataset.iter(batch_size=TEXT_BATCH):
            yield from batch["text"]


class TrainRows:
    """The prepared training split: its size, the digest of its examples and its texts; the rows
    themselves only on demand (the builder, to featurize)."""

    def __init__(self, directory: Path, meta: dict, cache_outcome: str, rows: list[dict] | None = None):
        import datasets

        self.directory, self.meta = directory, meta
        self.texts = TextColumn(datasets.load_from_disk(str(directory / "texts")), meta.get("texts_sha256"))
        self.digest: str = meta["digest"]
        self.key: str = meta["key"]
        self.cache_outcome = cache_outcome
        """hit: the entry was found; miss: a node of this job built it."""
        self._rows = rows

    def __len__(self) -> int:
        return self.meta["rows"]

    def __repr__(self) -> str:  # what a JSON dump with default=str records: size and content digest
        return f"TrainRows(rows={len(self)}, digest={self.digest})"

    def dataset(self) -> datasets.Dataset:
        """The normalized examples as the memory-mapped datasets.Dataset they were saved as."""
        import datasets

        return datasets.load_from_disk(str(self.directory / "examples"))

    def examples(self) -> list[dict]:
        """The normalized examples as Python objects (the builder's featurize only)."""
        if self._rows is None:
            self._rows = self.dataset().to_list()
        return self._rows

    def release(self) -> None:
        self._rows = None


@dataclass(frozen=True)
class PreparedFeatures:
    """One split's features as prepared: the memory-mapped Dataset, the key of its entry and
    whether this job found the entry (hit) or a node built it (miss). It reads as the Dataset it
    holds (rows, columns, its methods), as the loaders, the metrics and the teacher pass take it."""

    dataset: datasets.Dataset
    key: str
    cache_outcome: str

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | slice | str | list[int]) -> Any:
        return self.dataset[key]

    def __getitems__(self, keys: list[int]) -> list[dict]:  # a DataLoader's batched fetch
        return self.dataset.__getitems__(keys)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "dataset":  # copy and pickle protocols are the wrapper's own
            raise AttributeError(name)
        return getattr(self.dataset, name)
