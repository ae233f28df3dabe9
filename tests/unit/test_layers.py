"""The import layers of docs/ARCHITECTURE.md, enforced: a module imports only from its own layer or
lower ones (every import counts: at the top, inside a function, under TYPE_CHECKING, relative, or
by name through importlib), inside each package only from its own inner layer or lower ones (the
order its __init__ docstring gives), no two modules import each other through any chain, and the
config layer loads without torch."""
from __future__ import annotations

import ast
import functools
import re
import sys

from helpers import ROOT

PACKAGE = ROOT / "pipeline"
LAYERS = [  # lowest first; a name covers a module or a package and everything in it
    ("errors", "names", "fsutil", "layout", "compat", "job_record", "predictions"),
    ("tasks",),
    ("config",),
    ("runtime",),
    ("measure",),
    ("data", "models", "evaluation", "kd"),
    ("tracking",),
    ("export",),
    ("job",),
    ("report", "study"),
    ("commands",),
    ("cli", "__main__"),
]
NEVER = [  # within their layers, beyond the order: these packages start or read jobs, never run them
    ("pipeline.study", "pipeline.job"), ("pipeline.report", "pipeline.job"),
]
INSIDE = re.compile(r"^Inside, lowest first: (.+?)(?:\n\s*\n|\Z)", re.M | re.S)
"""A package docstring's order of its own modules: names separated by spaces, layers by `|`."""
NAMED = re.compile(r"^pipeline(\.\w+)+")


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports(name: str) -> set[str]:
    return _imports(name, MODULES[name])


@functools.cache
def _imports(name: str, path) -> set[str]:
    """The pipeline modules `name` imports anywhere in its file (a package's submodule where the
    import names one, else the package): absolute and relative imports, and the module names a
    file that calls importlib.import_module spells out (a registry's 'pipeline.tasks.ner:NerTask')."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, named, by_name = set(), set(), False
    for node in ast.walk(tree):  # one walk: it is most of this test file's time
        if isinstance(node, ast.Attribute) and node.attr == "import_module":
            by_name = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and NAMED.match(node.value):
            named.add(NAMED.match(node.value).group(0))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline.")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "pipeline" or base.startswith("pipeline."):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in MODULES else base)
    if by_name:
        found |= named
    return frozenset(m for m in found if m in MODULES and m != name)


def layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{name}: in no layer of tests/unit/test_layers.py (add it, and to docs/ARCHITECTURE.md)")


def inner_layers(package: str) -> dict[str, int]:
    """A package's own order: the unit (a module or subpackage directly inside it) -> its layer."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text(encoding="utf-8"))) or ""
    found = INSIDE.search(doc)
    if not found:
        return {}
    return {unit: i for i, names in enumerate(found.group(1).split("|")) for unit in names.split()}


def unit(package: str, name: str) -> str | None:
    """The module or subpackage directly inside `package` that `name` is or lies in."""
    rest = name[len(package) + 1:] if name.startswith(package + ".") else None
    return rest.split(".")[0] if rest else None


PACKAGES = sorted(m for m in MODULES if is_package(m) and m != "pipeline")


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    upward = [f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})" for m in sorted(MODULES) if m != "pipeline"
              for i in sorted(imports(m)) if layer(i) > layer(m)]
    assert not upward, "\n".join(upward)


def test_every_package_orders_its_modules_and_they_keep_that_order():
    """Inside a package, as between packages: each module or subpackage imports from its own inner
    layer or lower ones; the package's __init__ (its face) is left out."""
    problems = []
    for package in PACKAGES:
        order = inner_layers(package)
        units = {unit(package, m) for m in MODULES if unit(package, m)}
        if len(units) > 1 and set(order) != units:
            problems.append(f"{package}: its docstring's 'Inside, lowest first:' line names {sorted(order)}, "
                            f"the package holds {sorted(units)}")
            continue
        for m in sorted(m for m in MODULES if unit(package, m)):
            for i in sorted(imports(m)):
                a, b = unit(package, m), unit(package, i)
                if b and a != b and order[b] > order[a]:
                    problems.append(f"{m} (inner layer {order[a]}) imports {i} (inner layer {order[b]})")
    assert not problems, "\n".join(problems)


def test_a_study_a_report_and_the_ui_never_import_the_loop():
    found = [f"{m} imports {i}" for m in sorted(MODULES) for i in sorted(imports(m))
             for a, b in NEVER if (m == a or m.startswith(a + ".")) and (i == b or i.startswith(b + "."))]
    assert not found, "\n".join(found)


def test_no_import_cycle_even_through_deferred_imports():
    graph = {m: imports(m) for m in MODULES}
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_every_kind_of_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above fail on what they are meant to catch (a test that cannot fail is no test):
    an absolute, a relative and an importlib import upward, a cycle, and a package's inner order."""
    (tmp_path / "config").mkdir()
    (tmp_path / "tracking").mkdir()
    fake = {"pipeline.config.schema": "from ..job.loop import run\n",
            "pipeline.config": '"""Inside, lowest first: schema"""',
            "pipeline.job.loop": "import pipeline.job.stage\n",
            "pipeline.job.stage": "def f():\n    from pipeline.job.loop import run\n",
            "pipeline.tasks": "import importlib\nimportlib.import_module('pipeline.job.run')\n",
            "pipeline.job.run": "",
            "pipeline.tracking": '"""Inside, lowest first: store | sink"""',
            "pipeline.tracking.store": "from . import sink\n",
            "pipeline.tracking.sink": ""}
    paths = {}
    for name, text in fake.items():
        parts = name.split(".")[1:]
        path = tmp_path.joinpath(*parts, "__init__.py") if name in ("pipeline.config", "pipeline.tracking") else \
            tmp_path.joinpath(*parts[:-1], f"{parts[-1]}.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[name] = path
    monkeypatch.setattr(sys.modules[__name__], "MODULES", paths)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ["pipeline.config", "pipeline.tracking"])
    assert imports("pipeline.config.schema") == {"pipeline.job.loop"}
    assert imports("pipeline.tasks") == {"pipeline.job.run"}
    assert imports("pipeline.tracking.store") == {"pipeline.tracking.sink"}
    for check, expected in ((test_every_module_imports_only_its_own_layer_or_lower_ones,
                             "pipeline.config.schema (layer 2) imports pipeline.job.loop (layer 8)"),
                            (test_every_module_imports_only_its_own_layer_or_lower_ones,
                             "pipeline.tasks (layer 1) imports pipeline.job.run (layer 8)"),
                            (test_every_package_orders_its_modules_and_they_keep_that_order,
                             "pipeline.tracking.store (inner layer 0) imports pipeline.tracking.sink (inner layer 1)"),
                            (test_no_import_cycle_even_through_deferred_imports,
                             "pipeline.job.loop -> pipeline.job.stage -> pipeline.job.loop")):
        try:
            check()
        except AssertionError as e:
            assert expected in str(e)
        else:
            raise AssertionError(f"{check.__name__} passed on {expected}")


def private_imports(package: str) -> list[str]:
    """`from pipeline.PACKAGE.X import _name` in PACKAGE's own modules: a private name of another module."""
    found = []
    for name in sorted(m for m in MODULES if m.startswith(package + ".")):
        for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                found += [f"{name} imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_study_module_imports_a_private_name_of_another():
    """What study/ modules share is public, with its docstring, where it belongs (the executor seam,
    slurm_job, spec): a `_name` stays inside its own module."""
    found = private_imports("pipeline.study")
    assert not found, "\n".join(found)


def test_the_private_import_check_sees_one(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("from pipeline.study.runner import _logs, exit_file\n")
    monkeypatch.setitem(MODULES, "pipeline.study.fake", tmp_path / "a.py")
    assert private_imports("pipeline.study") == ["pipeline.study.fake imports pipeline.study.runner._logs"]
