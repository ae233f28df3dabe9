"""Readers the tasks share: text files line by line, JSON Lines, CSV/TSV tables and hub splits.

Every problem is a UserError naming the file, the line and the reason; nothing is repaired.
"""
from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pipeline.errors import UserError

if TYPE_CHECKING:
    import _csv

    import datasets

HUB_SPLIT = {"train": "train", "dev": "validation", "test": "test"}
"""Our split -> the hub's split name."""
MAX_FIELD_CHARS = 1_000_000
"""The longest field a reader accepts (characters): far beyond any text a model is trained on
(max_length is a few hundred tokens), so a longer one is a broken file, e.g. a missing
closing quote that swallowed the lines after it."""


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


def _blank(f: IO[bytes]) -> bool:
    """Nothing but whitespace in the file (read up to its first other byte)."""
    while block := f.read(1 << 16):
        if block.strip():
            return False
    return True


def read_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
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


def _check_field(path: Path, line: int, name: str, value: object) -> None:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        raise UserError(f"{path}: line {line}: field {name!r} is {len(value):,} characters long, "
                        f"over the limit of {MAX_FIELD_CHARS:,}")


@contextlib.contextmanager
def _csv_field_limit(limit: int) -> Iterator[None]:
    """csv's own limit (131072 by default) raises without naming the field: lift it while reading
    (no field can be longer than the text in memory) and check lengths ourselves."""
    previous = csv.field_size_limit(max(limit, csv.field_size_limit()))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


@contextlib.contextmanager
def _csv_errors(path: Path, reader: _csv._reader) -> Iterator[None]:
    """csv.Error (a NUL byte, a stray quote) as a UserError naming the line."""
    try:
        yield
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num}: cannot parse ({e})") from None


def load_hub_split(source: str, split: str) -> datasets.Dataset:
    """`hub:ID[:CONFIG]` through datasets.load_dataset (dev reads the 'validation' split)."""
    import datasets

    _, _, rest = source.partition(":")
    ident, _, config = rest.partition(":")
    try:
        return datasets.load_dataset(ident, config or None, split=HUB_SPLIT[split])
    except Exception as e:  # offline, unknown id, missing split: all the user's to fix
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"data.{split}={source}: cannot load from the hub ({reason})") from None
