"""Is the pipeline installed in this interpreter's environment? The GPU make targets run it first when given
a node's own Python (`make gpu-check PY=python3`): they install nothing, so what is missing is said in one
line (exit 2) before a check starts and fails halfway. Reads pyproject.toml's requirements and the GPU
check's (launch/wheelhouse.py, GPU_CHECK_NEEDS); imports nothing of the pipeline. Standard library only
(and `packaging` where installed, for the version floors).

  python3 launch/node_ready.py
"""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launch"))
from wheelhouse import GPU_CHECK_NEEDS  # noqa: E402 - beside this file, not a package


def requirements() -> list[str]:
    """pyproject.toml's [project] dependencies (without tomllib on Python 3.10: the list read as text)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M)[1]
    return [*re.findall(r'^\s*"([^"]+)"', block, re.M), *GPU_CHECK_NEEDS]


def problems(reqs: list[str]) -> list[str]:
    """Each requirement this environment lacks ("deepspeed") or holds too old ("tokenizers 0.23.2 < 0.23.3")."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # no floors checked: presence only
        Requirement = None
    out = []
    for text in reqs:
        name = re.match(r"[A-Za-z0-9._-]+", text)[0]
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(name)
            continue
        if Requirement is not None:
            spec = Requirement(text).specifier
            if not spec.contains(version.split("+")[0], prereleases=True):
                out.append(f"{name} {version} (needs {spec})")
    return out


def main() -> int:
    found = problems(requirements())
    if found:
        print(f"{sys.executable}: the pipeline is not installed here: {', '.join(found)}; install it from a "
              "wheelhouse (benchmarks/README.md, \"GPU check\")", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
