"""A guard on the suite itself: on a CPU machine nothing is skipped but what needs a GPU or a browser.

A path a CPU skips is a path CI never ran. Every skip in tests/ (pytest.skip, pytest.mark.skip and
skipif, pytest.importorskip) is read from the source: its reason must name the GPU (CUDA, NVML) or
the browser (Chromium) it waits for, or be one of the few platform facts listed below, none of them a
precision, backend or launch mode; and no skip may hang on what the CPU can compute (bf16 or fp16
kernels), which the suite's emulation override (conftest.py) makes every CPU run."""
import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NEEDS_HARDWARE = ("GPU", "CUDA", "NVML", "Chromium")
PLATFORM_FACTS = {
    # data preparation's worker pool: a 1-core machine has no second process to compare with
    ("integration/test_features.py", "worker processes need 2 cores"),
    # Linux interfaces the study runner's kill handling is built on
    ("integration/test_study_kill.py", "reads the runner's children from /proc"),
    ("integration/test_study_concurrency.py", "the parent-death signal is Linux's prctl"),
}
CPU_DEPENDENT = ("cpu_supports_bf16", "cpu_supports_fp16", "cpu_runs_bf16", "mkldnn", "BF16", "avx")


def _text(node: ast.AST | None, constants: dict[str, str]) -> str:
    """A reason's words: a string, an f-string's literal parts, or a module-level string constant."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, constants) for v in node.values)
    if isinstance(node, ast.Name):
        return constants.get(node.id, "")
    if isinstance(node, ast.BinOp):
        return _text(node.left, constants) + _text(node.right, constants)
    if isinstance(node, ast.IfExp):  # each branch must say it: both are read
        return _text(node.body, constants) + " | " + _text(node.orelse, constants)
    return ""


def _skips(path: Path) -> list[tuple[str, str, int]]:
    """(reason, condition source, line) of every skip in one test file."""
    source = path.read_text()
    tree = ast.parse(source)
    assigned = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    constants = {name: _text(value, {}) for name, value in assigned.items()}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name not in ("pytest.skip", "pytest.mark.skip", "pytest.mark.skipif", "pytest.importorskip"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        if name == "pytest.mark.skipif":
            condition, reason = (node.args[0] if node.args else None), keywords.get("reason")
        elif name == "pytest.importorskip":
            condition, reason = node.args[0], keywords.get("reason", node.args[0])
        else:
            condition, reason = None, keywords.get("reason", node.args[0] if node.args else None)
        cond = ast.unparse(condition) if condition is not None else ""
        if condition is not None:  # a module-level name in the condition is read as what it holds
            cond += "".join(f" [{n.id} = {ast.unparse(assigned[n.id])}]" for n in ast.walk(condition)
                            if isinstance(n, ast.Name) and n.id in assigned)
        if name == "pytest.skip":  # its condition is the `if` around it
            parents = [p for p in ast.walk(tree) if isinstance(p, ast.If) and node in ast.walk(p)]
            cond = " ".join(ast.unparse(p.test) for p in parents)
        found.append((_text(reason, constants), cond, node.lineno))
    return found


def test_a_cpu_machine_skips_only_what_needs_a_gpu_or_a_browser():
    wrong = []
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS).as_posix()
        for reason, cond, line in _skips(path):
            allowed = (all(any(word.lower() in part.lower() for word in NEEDS_HARDWARE) for part in reason.split(" | "))
                       or (rel, reason) in PLATFORM_FACTS)
            hangs_on_cpu = any(word in cond for word in CPU_DEPENDENT)
            if not allowed or hangs_on_cpu:
                wrong.append(f"{rel}:{line}: skip {reason!r} if {cond!r}")
    assert not wrong, "skips a CPU machine may take for a reason other than a GPU or a browser:\n" + "\n".join(wrong)


def test_the_guard_reads_every_kind_of_skip(tmp_path):
    """The reader itself: each form of skip is found, with its reason and condition."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\nWHY = 'needs a CUDA GPU'\n"
        "@pytest.mark.skipif(not precision.cpu_supports_bf16(), reason='this CPU has no bf16')\ndef test_a(): pass\n"
        "BF16 = precision.cpu_supports_bf16()\n"
        "@pytest.mark.skipif(GPUS == 0, reason=WHY)\ndef test_b(): pass\n"
        "@pytest.mark.skipif(not BF16, reason='needs a GPU' if x else 'no bf16')\ndef test_d(): pass\n"
        "def test_c():\n    if prec == 'bf16' and not precision.cpu_supports_bf16():\n"
        "        pytest.skip(f'this CPU has no {prec}')\n")
    got = {reason: cond for reason, cond, _ in _skips(sample)}
    assert got == {"this CPU has no bf16": "not precision.cpu_supports_bf16()", "needs a CUDA GPU": "GPUS == 0",
                   "this CPU has no ": "prec == 'bf16' and (not precision.cpu_supports_bf16())",
                   "needs a GPU | no bf16": "not BF16 [BF16 = precision.cpu_supports_bf16()]"}
