"""docs/ARCHITECTURE.md names modules by path; each one it names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").is_file()}
# `pkg/module.py`, `pkg/module` or `pipeline/pkg/module.py`, possibly followed by `.attribute`
NAMED = re.compile(r"`(?:pipeline/)?((?:[a-z_]+/)+[a-z_]+)(?:\.py)?(?:\.[A-Za-z_]+)*")


def named_modules(text: str) -> set[str]:
    return {m.group(1) for m in NAMED.finditer(text) if m.group(1).split("/")[0] in PACKAGES}


def layout_modules(text: str) -> set[str]:
    """The modules of the Layout tree: `  pkg/` opens a package whose lines name `module.py`s,
    `  module.py` at the top level is pipeline's own."""
    tree = text.split("```\npipeline/\n", 1)[1].split("```", 1)[0]
    named, package = set(), None
    for line in tree.splitlines():
        if not line.startswith("  "):  # configs/, launch/, docs/: beside pipeline/
            break
        top = re.match(r"  ([a-z_]+)(/|\.py)", line)
        if top:
            package = top.group(1) if top.group(2) == "/" else None
        for module in re.findall(r"(?<![\w/])((?:[a-z_]+/)*[a-z_]+)\.py\b", line):
            named.add(f"{package}/{module}" if package and "/" not in module else module)
    return named - {"__main__"}


def exists(path: str) -> bool:
    base = ROOT / "pipeline" / path
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def test_every_module_the_architecture_names_exists():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = named_modules(text) | layout_modules(text)
    # it reads the doc's spelling
    assert {"runtime/world", "job/parts/step_losses", "job/records/metrics", "models"} <= named
    assert [path for path in sorted(named) if not exists(path)] == []


def test_a_module_that_does_not_exist_is_caught():
    assert not exists("study/plan") and "study/plan" in named_modules("see `study/plan.py` and `study/plan`")
