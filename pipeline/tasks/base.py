"""The Task interface: everything that differs between tasks lives behind it.

read (file in the dataset's own format, or hub:ID[:CONFIG]) -> validate -> normalize ->
featurize (tokenize) -> collate (dynamic padding) -> model head -> predictions -> metrics.
A data problem is a UserError naming file, row and reason, raised before training starts.
"""
from __future__ import annotations

import contextlib
import csv
import json
import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from normalizer import normalize
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

from pipeline.errors import UserError
from pipeline.tasks import samples

SPLITS = ("train", "dev", "test")
HUB_SPLIT = {"train": "train", "dev": "validation", "test": "test"}
MAX_FIELD_CHARS = 1_000_000
"""The longest field a reader accepts (characters): far beyond any text a model is trained on
(max_length is a few hundred tokens), so a longer one is a broken file, e.g. a missing
closing quote that swallowed the lines after it."""
PARALLEL_ROWS = 20_000
"""From this many rows (texts) up, normalization and tokenization run in worker processes: the
normalizer does ~7k short comments/s on one core, so 20k rows are ~3 s of work against ~0.2 s to
fork workers and move the rows (datasets' map with num_proc also writes and joins shards: ~1 s);
below it, and for the built-in sample sets and tests, everything stays in-process."""


class Task(ABC):
    name: ClassVar[str]
    main_metric: ClassVar[str]
    """The key of metrics() that early stopping and eval/main use."""
    default_model: ClassVar[str] = "preset:bangla-small"
    model_class: ClassVar[Any] = AutoModelForSequenceClassification
    featurize_reads_datasets: ClassVar[bool] = False
    """featurize() also takes the prepared training examples as the memory-mapped datasets.Dataset
    they are saved as (and maps over it on disk), so the builder drops their Python rows first."""
    group_by_length: ClassVar[bool] = False
    """train.group_by_length when the config leaves it unset: True only where grouped batches kept
    the dev score within the seed spread (benchmarks/README.md has the runs)."""

    state_attributes: ClassVar[tuple[str, ...]] = ()
    """Attributes that load() or featurize() set and later steps read (NER's tag set, the
    predictions' width): kept with prepared features, so a cache hit restores them."""

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})

    def state(self) -> dict:
        return {name: getattr(self, name) for name in self.state_attributes}

    def restore_state(self, state: dict) -> None:
        for name in self.state_attributes:
            if name in state:
                setattr(self, name, state[name])

    # ------------------------------------------------------------------ data
    @abstractmethod
    def write_samples(self, directory: Path) -> dict[str, Path]:
        """Write the built-in deterministic sample set in the dataset's own format."""

    @abstractmethod
    def read_file(self, path: Path) -> list[dict]:
        """Parse and validate one file; UserError names file, row and reason."""

    @abstractmethod
    def from_hub_rows(self, rows, source: str) -> list[dict]:
        """Validate rows of a hub dataset (same checks as files)."""

    def read_chunks(self, path: Path) -> Iterator[list[dict]]:
        """read_file in consecutive pieces: one piece here; a task whose rows are independent
        reads, validates and normalizes a large file piece by piece instead (text classification),
        so the training split's builder never holds it whole."""
        yield self.read_file(path)

    def load_chunks(self, source: str | None, split: str) -> Iterator[list[dict]]:
        """Examples of one split in consecutive pieces; `source` None means the built-in sample set."""
        source = self.resolve_source(source, split)
        if source.startswith("hub:"):
            yield self.from_hub_rows(load_hub_split(source, split), source)
        else:
            yield from self.read_chunks(Path(source))

    def load(self, source: str | None, split: str) -> list[dict]:
        """Examples of one split, all of them."""
        return [example for chunk in self.load_chunks(source, split) for example in chunk]

    def resolve_source(self, source: str | None, split: str) -> str:
        """`hub:ID[:CONFIG]`, or the path of a data file that exists (the sample set's for None)."""
        if source is None:
            return str(samples.ensure_samples(self.name, self.write_samples)[split])
        if source.startswith("hub:"):
            return source
        path = Path(source)
        if path.is_dir():
            raise UserError(f"data.{split}={source}: is a directory, expected a data file")
        if not path.exists():
            raise UserError(f"data.{split}={source}: no such file")
        if not path.is_file():
            raise UserError(f"data.{split}={source}: not a regular file")
        return source

    @abstractmethod
    def texts(self, examples: list[dict]) -> list[str]:
        """Normalized text of the examples, for training a preset's tokenizer."""

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        """Head configuration for AutoConfig (num_labels, id2label, label2id)."""
        return {}

    @abstractmethod
    def featurize(self, examples: list[dict], tokenizer, max_length: int, split: str):
        """A datasets.Dataset of features: model inputs, the training target(s) the HF head
        takes (`labels`, or `start_positions`/`end_positions`) and `idx` (the feature's row
        number, 0..n-1). One example may give several features (QA windows)."""

    def map_batched(self, dataset, function: Callable, **kwargs):
        """dataset.map(function, batched=True), in worker processes when the rows are many."""
        workers = worker_count(len(dataset))
        return dataset.map(function, batched=True, num_proc=workers if workers > 1 else None, **kwargs)

    def collator(self, tokenizer) -> Callable:
        """Batches of features -> dict of tensors: model inputs, targets and `idx`, padded to
        the longest sequence in the batch. Anything else must be dropped here."""
        return DataCollatorWithPadding(tokenizer)

    def loss(self, outputs, batch: dict) -> torch.Tensor:
        """The training loss of a batch; the model's own (from the targets in the batch) unless
        a task needs another."""
        return outputs.loss

    @abstractmethod
    def predictions(self, outputs, batch: dict) -> dict[str, np.ndarray]:
        """Numpy arrays with one row per feature of an eval batch. Shapes beyond the first
        dimension must not depend on the batch (pad per-token outputs to max_length): the
        loop concatenates batches, gathers ranks and orders the rows by `idx`."""

    @abstractmethod
    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict], features) -> dict[str, float]:
        """Task metrics from all predictions of a split (row i = feature i of `features`, the
        Dataset featurize returned); must include `main_metric`."""

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features) -> str:
        """A human-readable per-class report (logged as an artifact)."""
        return ""

    # ------------------------------------------------------------------ distillation
    kd_outputs: ClassVar[dict[str, bool]] = {"logits": False}
    """Model outputs the KD loss compares, and whether each is per token ([B, L, ...])."""

    def kd_pairs(self, student_outputs, teacher: dict[str, torch.Tensor], batch: dict):
        """(student logits, teacher logits) pairs, rows = the distributions to match."""
        return [(student_outputs["logits"], teacher["logits"])]


# ---------------------------------------------------------------------- helpers for tasks


def worker_count(rows: int) -> int:
    """Worker processes for `rows` rows: 1 below PARALLEL_ROWS, else one per usable core (at
    most 8, and at most one per PARALLEL_ROWS rows)."""
    if rows < PARALLEL_ROWS:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8, rows // PARALLEL_ROWS))


def in_workers(function: Callable, arguments: list[tuple]) -> list:
    """[function(*a) for a in arguments], in worker processes when they are many (PARALLEL_ROWS).
    An exception in a worker (a UserError naming a row) is raised here."""
    workers = worker_count(len(arguments))
    if workers == 1:
        return [function(*a) for a in arguments]
    # fork: the workers have the normalizer and the task already; only the arguments travel
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.starmap(function, arguments, chunksize=max(1000, len(arguments) // (workers * 8)))


def normalize_texts(texts: list[str]) -> list[str]:
    """normalizer.normalize of every text, in worker processes when they are many."""
    return in_workers(normalize, [(t,) for t in texts])


def read_text(path: Path) -> str:
    """UTF-8 text, or a UserError naming the line with the first invalid byte (a document read
    whole: a JSON file; tables and JSON Lines are read line by line with read_lines)."""
    return "".join(read_lines(path))


def read_lines(path: Path) -> Iterator[str]:
    """The file's lines with their endings, decoded one by one (a large file is never in memory
    whole), or a UserError: the file is empty or unreadable, or a line has an invalid UTF-8
    byte (splitting at newline bytes is safe: no multi-byte UTF-8 sequence contains one)."""
    try:
        f = path.open("rb")
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a data file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        try:
            if _blank(f):
                raise UserError(f"{path}: empty file")
            f.seek(0)
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise UserError(f"{path}: line {number}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
                yield line.removeprefix("\ufeff") if number == 1 else line
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None


def _blank(f) -> bool:
    """Nothing but whitespace in the file (read up to its first other byte)."""
    while block := f.read(1 << 16):
        if block.strip():
            return False
    return True


def read_json_lines(path: Path):
    """(line number, object) of each non-blank line of a JSON Lines file; every line must be an
    object whose text fields fit MAX_FIELD_CHARS."""
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {number}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}: line {number}: expected a JSON object, got {type(obj).__name__}")
        for key, value in obj.items():
            _check_field(path, number, key, value)
        yield number, obj


def read_table(path: Path, required: tuple[str, ...], delimiter: str,
               quoting: int = csv.QUOTE_MINIMAL) -> Iterator[tuple[int, dict]]:
    """Rows of a CSV/TSV file with a header, as (line number, row), parsed as they are read;
    checks the columns, that every row has as many fields as the header (a row with more or
    fewer is refused, never cut or padded) and that no field is longer than MAX_FIELD_CHARS."""
    reader = csv.reader(read_lines(path), delimiter=delimiter, quoting=quoting)
    rows = 0
    try:
        longest = path.stat().st_size + 1  # no field is longer than the file
    except OSError:
        longest = 0  # read_lines names what is wrong with the path
    with _csv_field_limit(longest), _csv_errors(path, reader):  # the limit is ours, with line and column
        columns = [c.strip() for c in next(reader, [])]
        missing = [c for c in required if c not in columns]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)} "
                            f"(found: {', '.join(columns) or 'none'})")
        for fields in reader:
            if not fields:  # a blank line
                continue
            if len(fields) != len(columns):
                raise UserError(f"{path}: line {reader.line_num}: {len(fields)} fields, expected {len(columns)} "
                                f"({delimiter_name(delimiter)}-separated: {', '.join(columns)})")
            for column, value in zip(columns, fields):
                _check_field(path, reader.line_num, column, value)
            rows += 1
            yield reader.line_num, dict(zip(columns, fields))
    if not rows:
        raise UserError(f"{path}: no data rows")


def delimiter_name(delimiter: str) -> str:
    return {"\t": "tab", ",": "comma"}.get(delimiter, repr(delimiter))


def _check_field(path: Path, line: int, name: str, value) -> None:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        raise UserError(f"{path}: line {line}: field {name!r} is {len(value):,} characters long, "
                        f"over the limit of {MAX_FIELD_CHARS:,}")


@contextlib.contextmanager
def _csv_field_limit(limit: int):
    """csv's own limit (131072 by default) raises without naming the field: lift it while reading
    (no field can be longer than the text in memory) and check lengths ourselves."""
    previous = csv.field_size_limit(max(limit, csv.field_size_limit()))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


@contextlib.contextmanager
def _csv_errors(path: Path, reader):
    """csv.Error (a NUL byte, a stray quote) as a UserError naming the line."""
    try:
        yield
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num}: cannot parse ({e})") from None


def load_hub_split(source: str, split: str):
    """`hub:ID[:CONFIG]` through datasets.load_dataset (dev reads the 'validation' split)."""
    import datasets

    _, _, rest = source.partition(":")
    ident, _, config = rest.partition(":")
    try:
        return datasets.load_dataset(ident, config or None, split=HUB_SPLIT[split])
    except Exception as e:  # offline, unknown id, missing split: all the user's to fix
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"data.{split}={source}: cannot load from the hub ({reason})") from None


def logits_to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()
