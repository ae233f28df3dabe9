"""A study's cells side by side and on Slurm: the tests that train a model or start a process (the
others are in tests/unit/test_study_concurrency.py)."""
import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from helpers import FAST, ROOT, mlflow_runs, run_cli, tracking_db
from pipeline import names

# ------------------------------------------------------------------ Slurm, faked

FAKE_SBATCH = """\
#!{python}
# Fake sbatch: records the submission, answers a job id (--parsable), and runs the script at once
# (cwd and output from its #SBATCH lines) unless an afterok dependency failed: then, as with
# --kill-on-invalid-dep=yes, the job is cancelled without running.
import json, os, re, subprocess, sys
state = os.environ["FAKE_SLURM"]
jobs = [json.loads(l) for l in open(os.path.join(state, "jobs.jsonl"))] if os.path.exists(
    os.path.join(state, "jobs.jsonl")) else []
job_id = str(1000 + len(jobs))
script = sys.argv[-1]
text = open(script).read()
opts = dict(re.findall(r"^#SBATCH --([\\w-]+)=(\\S+)", text, re.M))
dep = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--dependency=")), "")
kind, _, ids = dep.partition(":")
codes = {{j["id"]: j["exit"] for j in jobs}}
state_of = "CANCELLED" if kind == "afterok" and any(codes.get(i, 0) != 0 for i in ids.split(":")) else "RAN"
code = None
if state_of == "RAN":
    with open(opts["output"], "w") as out:
        code = subprocess.call(["bash", script], cwd=opts["chdir"], stdout=out, stderr=subprocess.STDOUT,
                               env={{**os.environ, "SLURM_JOB_ID": job_id}})
with open(os.path.join(state, "jobs.jsonl"), "a") as f:
    f.write(json.dumps({{"id": job_id, "argv": sys.argv[1:], "opts": opts, "state": state_of, "exit": code}}) + "\\n")
print(job_id)
"""

FAKE_SQUEUE = """\
#!/bin/sh
# Fake squeue: the jobs Slurm still holds, as the test set them (id name per line)
echo "$*" >> "$FAKE_SLURM/squeue.args"
printf '%s' "$FAKE_SQUEUE_JOBS"
"""


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH.format(python=sys.executable)), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SLURM": str(state)}


def jobs(state):
    return [json.loads(line) for line in (Path(state) / "jobs.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three processes (the submitting CLI, one failing cell, the report job): ~20 s of CPU
def test_slurm_executor_submits_cells_with_their_resources_dependencies_and_the_report(tmp_path, fake_slurm):
    db = tracking_db(tmp_path)
    out = tmp_path / "outputs" / "sl"
    spec = {
        "name": "sl", "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
        "overrides": [*FAST, "train.max_steps=2", f"tracking.uri=sqlite:///{db}"],
        "slurm": {"partition": "gpu", "time": "01:30:00", "account": "proj", "extra": ["--constraint=h100"]},
        "procedures": {
            # fails at start (no such data file): its student is cancelled, not left pending
            "teacher": {"command": "train", "overrides": [f"data.train={tmp_path / 'missing.tsv'}",
                                                          "data.dev=samples", "data.test=samples"]},
            "student": {"command": "distill", "launcher": {"type": "torchrun", "nproc": 2},
                        "overrides": ["kd.teacher=${teacher.output_dir}"]},
            "done": {"command": "train"}, "queued": {"command": "train"},
        },
        "matrix": {"tasks": ["sentiment"], "procedures": ["teacher", "student", "done", "queued"]},
    }
    path = tmp_path / "sl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    (out / "sentiment-done").mkdir(parents=True)
    (out / "sentiment-done" / "metrics.json").write_text("{}")  # finished before: not submitted again
    env = {**fake_slurm, "FAKE_SQUEUE_JOBS": "77 sl.sentiment-queued\n"}  # still queued from a submission before

    result = run_cli("study", path, "--executor", "slurm", env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "sentiment-done: finished before; skipped" in log
    assert "sentiment-queued: still queued or running as job 77; not submitted again" in log
    teacher, student, report = jobs(fake_slurm["FAKE_SLURM"])
    assert teacher["opts"]["job-name"] == "sl.sentiment-teacher" and teacher["state"] == "RAN"
    assert (teacher["opts"]["partition"], teacher["opts"]["time"], teacher["opts"]["account"]) == (
        "gpu", "01:30:00", "proj")
    assert teacher["opts"]["gpus-per-node"] == "1" and teacher["opts"]["constraint"] == "h100"
    assert student["opts"]["gpus-per-node"] == "2"  # torchrun nproc 2: two GPUs on one node
    assert f"--dependency=afterok:{teacher['id']}" in student["argv"] and "--kill-on-invalid-dep=yes" in student["argv"]
    assert student["state"] == "CANCELLED"
    (after,) = [a for a in report["argv"] if a.startswith("--dependency=afterany:")]
    assert sorted(after.split(":")[1:]) == sorted([teacher["id"], student["id"], "77"])  # every cell's job
    assert report["state"] == "RAN" and report["exit"] == 1, (out / "_logs" / "_report.log").read_text()[-3000:]
    assert "torch.distributed.run --nproc_per_node 2" in (out / "_slurm" / "sentiment-student.sbatch").read_text()

    # the report job recorded each cell's outcome on the parent run and wrote the report
    (parent,) = [r for r in mlflow_runs(db, "sl") if r.data.tags.get(names.PARENT_TAG) == "true"]
    outcome = {k[len(names.CELL_TAG_PREFIX):]: json.loads(v) for k, v in parent.data.tags.items()
               if k.startswith(names.CELL_TAG_PREFIX)}
    assert (outcome["sentiment-teacher"]["exit_code"], outcome["sentiment-teacher"]["status"]) == (2, "failed")
    assert "missing.tsv: no such file" in outcome["sentiment-teacher"]["reason"]
    assert outcome["sentiment-student"]["reason"] == "needs sentiment-teacher, which failed"
    assert outcome["sentiment-done"]["status"] == "finished"
    assert parent.info.status == "FAILED"
    assert (tmp_path / "report" / "report.md").is_file()
    squeue_args = (Path(fake_slurm["FAKE_SLURM"]) / "squeue.args").read_text()
    asked = next(a for a in squeue_args.split() if a.startswith("--name="))[len("--name="):].split(",")
    assert sorted(asked) == sorted(f"sl.sentiment-{p}" for p in ("teacher", "student", "done", "queued"))


@pytest.mark.slow  # two short processes (bash, python): under a second
def test_slurm_job_passes_slurms_sigterm_on_and_keeps_the_exit_code(tmp_path):
    """The cell script's wrapper, run by bash: a TERM to the batch shell reaches the stage, whose
    exit code (143 after its checkpoint) is what the job writes."""
    from pipeline.study.slurm_job import RUN_AND_KEEP_CODE

    stage = f"{sys.executable} -c " + shlex.quote(textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
        open(sys.argv[1], 'w').close()
        time.sleep(30)
    """).strip()) + f" {tmp_path / 'started'}"
    script = tmp_path / "job.sh"
    script.write_text(RUN_AND_KEEP_CODE.format(command=stage, exit_file=tmp_path / "exit"))
    job = subprocess.Popen(["bash", str(script)], cwd=ROOT)
    deadline = time.time() + 30
    while not (tmp_path / "started").exists():
        assert time.time() < deadline
        time.sleep(0.05)
    job.terminate()
    assert job.wait(timeout=30) == 143
    assert (tmp_path / "exit").read_text().strip() == "143"


def _process_group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc: field 5 of stat)."""
    members = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat_file.parent.name))
    return members


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_the_store_server_dies_with_a_runner_killed_by_sigkill(tmp_path):
    """A runner-like parent serving a study's store (store_server.serving), killed with SIGKILL
    (which no `finally` sees): within 5 s no process it started is left, the web server included,
    and the port answers no more. The server is one process, so nothing below it can be orphaned."""
    import urllib.request

    parent_code = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from pipeline.study.store_server import serving
        with serving(sys.argv[1], Path(sys.argv[2])) as url:
            print(url, flush=True)
            time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code, f"sqlite:///{tmp_path / 'mlflow.db'}",
                               str(tmp_path / "server.log")], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = parent.stdout.readline().strip()
        assert url.startswith("http://"), (tmp_path / "server.log").read_text()[-2000:]
        (server,) = [int(p) for p in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
        assert _process_group(server) == [server]  # uvicorn in place of `mlflow server`: one process
        urllib.request.urlopen(url + "/health", timeout=5)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _process_group(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _process_group(server) == []
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=2)
    finally:
        parent.kill()
