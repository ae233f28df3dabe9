"""The user-facing pages point at what is there: every relative link of README.md, docs/ and
benchmarks/ reaches a file and, where it names one, a heading of that file; every Python file
they name exists in the repository (a module moved is a page to update)."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from tests.helpers import ROOT

# docs/ARCHITECTURE.md is the contributors' page, checked by tests/unit/test_architecture_names.py.
PAGES = sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("*.md")}
               - {ROOT / "docs" / "ARCHITECTURE.md"})
# Named on purpose though absent: the script name the stored H100 results' command lines carry.
ABSENT_ON_PURPOSE = {"bench_train_gpu.py"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
PYTHON_FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (shell lines, not links)."""
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)


@cache
def anchors(page: Path) -> set[str]:
    """The heading anchors a Markdown renderer gives the page (lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered)."""
    seen: dict[str, int] = {}
    for line in prose(page).splitlines():
        if heading := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_relative_link_reaches_its_file_and_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links that reach nothing:\n" + "\n".join(broken)


@cache
def repository_files() -> frozenset[str]:
    return frozenset(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                     if not {".venv", "outputs", ".git"} & set(p.relative_to(ROOT).parts))


def named_file_exists(name: str) -> bool:
    """`name` is a file's path from the root, or its tail (`measure/memory.py`, `bench_kd.py`)."""
    return name in ABSENT_ON_PURPOSE or any(f == name or f.endswith("/" + name) for f in repository_files())


def test_every_python_file_a_page_names_exists():
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES
               for name in PYTHON_FILE.findall(page.read_text(encoding="utf-8")) if not named_file_exists(name)]
    assert not missing, "Python files named but not in the repository:\n" + "\n".join(missing)
