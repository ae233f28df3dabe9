"""Nothing outside runtime/ asks which backend runs (the runtime package's rule): no module there
compares a backend's name, and runtime answers what the rest needs to know of it (the checkpoint
layout a job's record keeps, whether a checkpoint resumes here)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from helpers import ROOT
from pipeline import job_record
from pipeline.errors import UserError
from pipeline.job import same_job
from pipeline.runtime.world import Runtime, resume_refusal

PACKAGE = ROOT / "pipeline"
ASKING_FOR_NOW: set[str] = set()
"""Modules outside runtime/ allowed to compare a backend's name: none (a stale entry fails)."""


def names_backend(node: ast.expr) -> bool:
    """`x.backend` or `backend`, or a tuple, list or set holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_backend(e) for e in node.elts)
    return (isinstance(node, ast.Attribute) and node.attr == "backend") or (
        isinstance(node, ast.Name) and node.id == "backend")


def names_a_name(node: ast.expr) -> bool:
    """A string, or a tuple, list or set holding one: what a backend is compared with."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_a_name(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def backend_questions(source: str) -> list[int]:
    """The lines of `source` that branch on a backend: a comparison (==, !=, in, ...) of one with
    a name or with another backend (not `backend is None`: a tokenizer's backend is no question),
    a match on one, a lookup keyed by one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        backends = [o for o in operands if names_backend(o)]
        if backends and (len(backends) > 1 or any(names_a_name(o) for o in operands)):
            found.append(node.lineno)
        elif isinstance(node, ast.Match) and names_backend(node.subject):
            found.append(node.lineno)
        elif isinstance(node, ast.Subscript) and names_backend(node.slice):
            found.append(node.lineno)
    return found


def outside_runtime() -> dict[str, list[int]]:
    asking = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("pipeline/runtime/"):
            continue
        lines = backend_questions(path.read_text(encoding="utf-8"))
        if lines:
            asking[name] = lines
    return asking


def test_no_module_outside_runtime_compares_a_backends_name():
    asking = outside_runtime()
    found = [f"{name}:{line}" for name, lines in asking.items() if name not in ASKING_FOR_NOW for line in lines]
    assert not found, "ask runtime (world.Runtime, the Backend) instead:\n" + "\n".join(found)
    stale = sorted(ASKING_FOR_NOW - set(asking))
    assert not stale, f"no longer asks which backend runs: remove from ASKING_FOR_NOW: {stale}"


@pytest.mark.parametrize("source", [
    'if rt.backend == "deepspeed": pass',
    'ok = old.backend != new.backend',
    'zero = "ddp" in (backend, launcher)',
    'match stage.rt.backend:\n    case "ddp": pass',
    'kind = {"ddp": 1}[rt.backend]',
])
def test_the_checker_sees_a_backend_asked_for(source):
    assert backend_questions(source) == [1]


def test_the_checker_leaves_the_backend_object_and_the_launcher_alone():
    assert backend_questions('if stage.backend.optimizer is not optimizer: pass\n'
                             'if cell.launcher.kind == "deepspeed": pass\n'
                             'if backend is not None: pass\n'
                             'tags = {"backend": rt.backend}\n') == []


def runtime(backend: str, world_size: int = 1) -> Runtime:
    return Runtime("torchrun", backend, 0, 0, world_size, 1, torch.device("cpu"))


def test_a_jobs_record_keeps_the_checkpoint_layout_of_its_backend():
    assert [runtime(b).checkpoint_layout for b in ("single", "ddp", "deepspeed")] == ["torch", "torch", "deepspeed"]


def test_a_checkpoint_resumes_under_its_own_layout_and_deepspeed_only_on_its_world_size():
    assert resume_refusal("torch", 2, "torch", 1) is None
    assert resume_refusal("deepspeed", 2, "deepspeed", 2) is None
    assert "launch 2 processes" in resume_refusal("deepspeed", 2, "deepspeed", 1)
    torch_two, ds_two = (job_record.JobRecord({}, "32 rows", 2, kind, "bf16", {}) for kind in ("torch", "deepspeed"))
    with pytest.raises(UserError) as e:
        same_job.check_settings(Path("/c"), torch_two, ds_two, [])
    assert str(e.value) == ("resume: checkpoint /c: written by the torch backend, asked to resume under deepspeed; "
                            "resume with backend=torch, or resume=never starts over")
