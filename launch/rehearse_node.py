"""The GPU check's node rehearsed on this CPU machine (`make rehearse-node`): what benchmarks/README.md's "GPU
check" call does there, step by step, with no GPU and this machine's Python.

1. A fresh virtualenv holding what the node's list (--node, its `pip freeze`) holds of what the pipeline and
   the GPU check use, at the node's versions where it gives them, its bare names at the versions pip picks
   beside the pipeline (what HAVE takes a bare name to be), from the package index (the node's image:
   set-up, not the install under test). STAND_INS says what stands in for what this machine cannot
   install.
2. That virtualenv's `pip freeze` as HAVE, and `make wheelhouse`'s folder for it: for this machine's Python
   and platform (the node's call names its own: Python 3.12, manylinux_2_28_x86_64).
3. `make install-offline` into it with no index (the index address unreachable, pip's configuration
   ignored), timed: the figure the node's budget leaves 90 s for.
4. `make gpu-check PY=<its python> GPU_CHECK_ARGS=--quick OUT=DIR/out`: the check's own code, on the CPU.

Everything under --dir (git-ignored `rehearsal/`); a summary in DIR/rehearsal.json. Exit 0 when the install
and the quick check passed.

  python launch/rehearse_node.py [--node benchmarks/gpu-node-packages.txt] [--dir rehearsal]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launch"))
import wheelhouse  # noqa: E402 - beside this file, not a package

STAND_INS = {
    "torch": ("2.13.0", "torch 2.11 from the index is its CUDA build (4.6 GB with its CUDA libraries); this "
                        "machine's CPU build 2.13.0 stands in (the node's torch is held, never installed)"),
    "numpy": (None, "numpy 2.5 needs Python 3.12; the newest for this machine's Python stands in"),
}
"""Node pins this machine cannot install: name -> (the version installed instead, None: pip's pick beside the
pipeline; why)."""


def sh(cmd: list[str], env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), cwd=ROOT, env=env, check=True, **kw)


def node_image(venv: Path, node: Path, work: Path) -> list[str]:
    """Step 1: the node's packages the pipeline uses, at its versions (less STAND_INS), its bare names at the
    versions pip picks beside the pipeline (what the wheelhouse takes a bare name to be: held, and enough);
    what was installed."""
    have = wheelhouse.read_have(node)
    for name, (version, _) in STAND_INS.items():
        if name in have:
            have[name] = version
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(ROOT)], check=True)
    project = next(work.glob("bangla_amp_pipeline-*.whl"))
    roots = [str(project), *wheelhouse.GPU_CHECK_NEEDS]
    with tempfile.TemporaryDirectory() as tmp:
        items = wheelhouse.resolve(roots, Path(tmp) / "r.json", None, work)
        # what the pipeline reaches without passing through torch (whose CUDA libraries the node has), and torch
        env = wheelhouse.marker_env(f"{sys.version_info[0]}.{sys.version_info[1]}", wheelhouse.this_platform())
        reached = wheelhouse.without_torch(items, ["bangla-amp-pipeline", *wheelhouse.GPU_CHECK_NEEDS], env)
        used = sorted(({wheelhouse.canonical(i["metadata"]["name"]) for i in reached} | {"torch"}) & set(have))
        direct = next(i for i in items if wheelhouse.canonical(i["metadata"]["name"]) == "bangla-amp-pipeline")
        constraints = wheelhouse.constraints_from(have, [*direct["metadata"].get("requires_dist", []), *roots[1:]])
        beside = wheelhouse.resolve([*roots, *used], Path(tmp) / "b.json", None, work, constraints)
    picked = {wheelhouse.canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in beside}
    pins = [f"{n}=={have[n] or picked[n]}" for n in used]  # a refused pin (tokenizers 0.23.2) as the node has it
    py = venv / "bin" / "python"
    sh([sys.executable, "-m", "venv", venv])
    sh([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    sh([py, "-m", "pip", "install", "-q", *pins])
    return pins


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", type=Path, default=ROOT / "benchmarks" / "gpu-node-packages.txt")
    ap.add_argument("--dir", type=Path, default=ROOT / "rehearsal")
    args = ap.parse_args(argv)
    work = args.dir.resolve()
    venv, house, out = work / "node", work / "wheelhouse", work / "out"
    for path in (venv, house, out):
        shutil.rmtree(path, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    py = venv / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this checkout on its path
    pins = node_image(venv, args.node, work)
    freeze = work / "have.txt"
    freeze.write_text(subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True, check=True,
                                     env=clean).stdout)
    sh([sys.executable, "launch/wheelhouse.py", "--dest", house, "--have", freeze])
    offline = {k: v for k, v in clean.items() if not k.startswith("PIP_")}
    offline.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/")  # no index, no find-links
    start = time.perf_counter()
    sh(["make", "-s", "install-offline", f"TARGET_PY={py}", f"WHEELHOUSE={house}"], env=offline)
    install_s = time.perf_counter() - start
    check = subprocess.run(["make", "-s", "gpu-check", f"PY={py}", f"OUT={out}", "GPU_CHECK_ARGS=--quick"],
                           cwd=ROOT, env=offline)
    summary = {"node": str(args.node), "python": sys.version.split()[0], "installed_as_the_node": pins,
               "stand_ins": {n: why for n, (_, why) in STAND_INS.items()},
               "wheelhouse_wheels": len(list(house.glob("*.whl"))),
               "wheelhouse_mib": round(wheelhouse.folder_mib(house), 1), "install_seconds": round(install_s, 1),
               "gpu_check_quick_pass": check.returncode == 0, "out": str(out)}
    (work / "rehearsal.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"rehearsal: {summary['wheelhouse_wheels']} wheels, {summary['wheelhouse_mib']} MiB; install with no "
          f"index {install_s:.1f} s; gpu_check --quick {'passed' if check.returncode == 0 else 'FAILED'} "
          f"(everything under {out})")
    return 0 if check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
