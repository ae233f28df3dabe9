"""docs/outputs.md's tables of names are pipeline/names.py's: every metric names.py spells is in the
metrics table and the table names none that names.py lacks; every tag names.py spells is in the tags
table. A name built by a function of names.py stands in the table with upper-case placeholders
(`loss_TERM`, `V/size_mb`, `latency_ms_p50/P/L`), and the function is expanded with the same ones."""
from __future__ import annotations

import inspect
import re

from pipeline import names
from tests.helpers import ROOT

PAGE = ROOT / "docs" / "outputs.md"
FULL = re.compile(r"[a-z]+/[a-z0-9_/]*[a-z0-9]")  # a whole metric name, not a prefix such as train/loss_


def _strings() -> dict[str, str]:
    return {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}


def _parts(prefix: str) -> list[str]:
    """The quantities a name-building function takes: PREFIX_* constants that are no whole name."""
    return [v for k, v in _strings().items() if k.startswith(prefix) and "/" not in v]


# Each function of names.py that builds metric names, and the names it builds as the table spells them.
EXPAND = {
    "train_loss_term": lambda f: {f("TERM")},
    "eval_metric": lambda f: {f("NAME")},
    "test_metric": lambda f: {f("NAME")},
    "load_metric": lambda f: {f(q, prefix) for q in _parts("LOAD_") for prefix in (names.PERF, names.INFER_LOAD)},
    "export_metric": lambda f: {f("V", q) for q in _parts("EXPORT_")},
    "export_test_metric": lambda f: {f("V", "NAME")},
    "infer_metric": lambda f: {f(q, "P", "L") for q in _parts("INFER_")},
    "infer_length": lambda f: {f(length) for length in names.INFER_LENGTHS},
    "agreement_metric": lambda f: {f("C"), *(f("C", q) for q in names.AGREEMENT_QUANTITIES)},
}


def names_py_metrics() -> set[str]:
    functions = {k for k, v in vars(names).items() if inspect.isfunction(v) and v.__module__ == names.__name__}
    assert functions == set(EXPAND), f"names.py functions this test does not expand: {sorted(functions - set(EXPAND))}"
    whole = {v for k, v in _strings().items() if not k.startswith("TAG_") and FULL.fullmatch(v)}
    return whole.union(*(expand(getattr(names, name)) for name, expand in EXPAND.items()))


def names_py_tags() -> set[str]:
    tags = {v for k, v in _strings().items() if k.startswith("TAG_")}
    return tags | {names.PARENT_TAG, names.CELL_TAG_PREFIX + "NAME"}


def table(heading: str) -> list[list[str]]:
    """The rows (cells) of the table under `### heading` in docs/outputs.md."""
    section = PAGE.read_text(encoding="utf-8").split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line.strip().strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return rows[1:]  # the header; the separator row does not start with "| "


def spelled(cell: str) -> set[str]:
    return {word for span in re.findall(r"`([^`]+)`", cell) for word in span.split()}


def doc_metrics() -> set[str]:
    return {family + name for family_cell, names_cell, *_ in table("Metrics")
            for family in spelled(family_cell) for name in spelled(names_cell)}


def test_the_metrics_table_is_names_py():
    documented, code = doc_metrics(), names_py_metrics()
    assert not code - documented, f"in names.py, not in docs/outputs.md: {sorted(code - documented)}"
    assert not documented - code, f"in docs/outputs.md, not in names.py: {sorted(documented - code)}"


def test_every_tag_of_names_py_is_in_the_tags_table():
    # One way: the version tags are named from their package's name (measure/telemetry.py), not in names.py.
    missing = names_py_tags() - set().union(*(spelled(row[0]) for row in table("Tags")))
    assert not missing, f"in names.py, not in docs/outputs.md: {sorted(missing)}"
