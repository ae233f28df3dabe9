"""The import layers of docs/ARCHITECTURE.md, enforced: a module imports only from its own layer or
lower ones (every import counts: at the top, inside a function, under TYPE_CHECKING), no two
modules import each other through any chain, and the config layer loads without torch."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from helpers import ROOT

PACKAGE = ROOT / "pipeline"
LAYERS = [  # lowest first; a name covers a module or a package and everything in it
    ("errors", "names", "fsutil", "layout", "compat"),
    ("config",),
    ("runtime", "tasks"),
    ("loop", "measure"),
    ("data", "models", "evaluation", "kd"),
    ("tracking",),
    ("jobs",),
    ("stage", "train"),
    ("report", "ui", "study"),
    ("cli", "__main__"),
]
EXCEPTIONS = {
    # the task registry is the one list of task names; its __init__ imports only errors when loaded
    ("pipeline.config.schema", "pipeline.tasks"),
}


NEVER = [  # within their layers, beyond the order: these packages start or read jobs, never run them
    ("pipeline.study", "pipeline.stage"), ("pipeline.study", "pipeline.train"),
    ("pipeline.report", "pipeline.stage"), ("pipeline.report", "pipeline.train"),
    ("pipeline.ui", "pipeline.train"), ("pipeline.runtime", "pipeline.tasks"),
]


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """The pipeline modules `name` imports anywhere in its file (a package's submodule where the
    import names one, else the package)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "pipeline" or node.module.startswith("pipeline.")):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES and m != name}


def layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{name}: in no layer of tests/test_layers.py (add it, and to docs/ARCHITECTURE.md)")


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    upward = [f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})" for m in sorted(MODULES) if m != "pipeline"
              for i in sorted(imports(m)) if layer(i) > layer(m) and (m, i) not in EXCEPTIONS]
    assert not upward, "\n".join(upward)


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


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The two checks above fail on what they are meant to catch (a test that cannot fail is no test)."""
    fake = {"pipeline.config.schema": "from pipeline.train import run\n", "pipeline.train": "import pipeline.stage\n",
            "pipeline.stage": "def f():\n    from pipeline.train import run\n"}
    for name, text in fake.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {n: tmp_path / f"{n}.py" for n in fake})
    assert imports("pipeline.config.schema") == {"pipeline.train"}
    for check, expected in ((test_every_module_imports_only_its_own_layer_or_lower_ones,
                             "pipeline.config.schema (layer 1) imports pipeline.train (layer 7)"),
                            (test_no_import_cycle_even_through_deferred_imports,
                             "pipeline.train -> pipeline.stage -> pipeline.train")):
        try:
            check()
        except AssertionError as e:
            assert expected in str(e)
        else:
            raise AssertionError(f"{check.__name__} passed on {expected}")


@pytest.mark.slow  # starts a Python process
def test_the_config_layer_loads_without_torch_or_transformers():
    code = ("import sys; import pipeline.config, pipeline.config.reference; "
            "print(sorted(m for m in ('torch', 'transformers', 'pipeline.tasks.base') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
