"""Faults: kill and resume exactly, preemption, divergence, corrupted checkpoints, a full disk,
a finished job resumed, durable writes."""
import json
import os

import pytest
import torch

from pipeline import fsutil
from pipeline.errors import Interrupted, UserError
from pipeline.job.parts import checkpoint
from pipeline.layout import OutputDir
from pipeline.tracking import sync


def test_corrupted_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    for step in (5, 10):
        checkpoint.save(OutputDir(tmp_path), step, {"x": torch.tensor([step])}, rank=0, keep=3)
    newest = tmp_path / "checkpoints" / "step-00000010" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:-7])  # truncated
    half = tmp_path / "checkpoints" / ".step-00000015.tmp"  # a save that was killed
    half.mkdir()
    found = checkpoint.latest(OutputDir(tmp_path))
    assert found.step == 5 and found.load_state()["x"].item() == 5
    assert "step-00000010 is corrupted" in caplog.text


def test_only_the_newest_k_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3, 4):
        checkpoint.save(OutputDir(tmp_path), step, {"x": torch.tensor([step])}, rank=0, keep=2)
    assert [c.step for c in checkpoint.complete(OutputDir(tmp_path))] == [3, 4]


def test_checkpoints_refuse_pickled_code(tmp_path):
    checkpoint.save(OutputDir(tmp_path), 1, {"x": torch.tensor([1])}, rank=0, keep=1)
    ckpt = checkpoint.latest(OutputDir(tmp_path))
    torch.save({"evil": object()}, ckpt.path / "state.pt")  # not a weights-only payload
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    manifest["files"]["state.pt"] = fsutil.file_sha256(ckpt.path / "state.pt")
    (ckpt.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        ckpt.load_state()


def test_sync_of_a_missing_journal_names_it(tmp_path):
    with pytest.raises(UserError, match=r"^sync: .*journal\.abandoned-x\.jsonl: no such file$"):
        sync(tmp_path / "journal.abandoned-x.jsonl")
    with pytest.raises(UserError, match=r"^sync: .*: no journal\.jsonl \(is it a stage's output_dir\?\)$"):
        sync(tmp_path)


# ---------------------------------------------------------------------- a full disk


def test_a_checkpoint_that_does_not_fit_says_so_and_leaves_no_temporary_folder(tmp_path):
    """The disk fills while the backend writes its state: the first MiB fits, the rest goes to
    /dev/full, whose writes fail with a real ENOSPC (no root mount for a small disk in a test)."""
    def backend(directory, rank):
        (directory / "backend.pt").write_bytes(os.urandom(1 << 20))
        with open("/dev/full", "wb") as rest:
            rest.write(os.urandom(1 << 20))

    with pytest.raises(fsutil.DiskFull, match=r"^no space left on device: writing .*/\.step-00000007\.tmp "):
        checkpoint.save(OutputDir(tmp_path), 7, {"x": torch.tensor([7])}, rank=0, keep=2, write_backend=backend)
    assert [p.name for p in OutputDir(tmp_path).checkpoints.iterdir()] == []


def test_torchs_errno_less_write_error_on_a_full_disk_is_still_named(tmp_path, monkeypatch):
    """torch.save to a path loses the errno of a full disk (RuntimeError: ... unexpected pos):
    the real error comes from writing backend.pt to /dev/full; the file system's answer to "how
    much space is left" is stood in for (0 bytes), as a test cannot fill a real disk."""
    def backend(directory, rank):
        os.symlink("/dev/full", directory / "backend.pt")
        torch.save({"w": torch.zeros(1 << 16)}, directory / "backend.pt")

    real_statvfs = os.statvfs

    def full(path):
        st = real_statvfs(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, st.f_files, st.f_ffree,
                                  st.f_favail, st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "statvfs", full)
    with pytest.raises(fsutil.DiskFull, match=r"no space left on device: writing .*step-00000003\.tmp \(0 MiB free"):
        checkpoint.save(OutputDir(tmp_path), 3, {"x": torch.tensor([3])}, rank=0, keep=2, write_backend=backend)
    assert [p.name for p in OutputDir(tmp_path).checkpoints.iterdir()] == []


# ---------------------------------------------------------------------- durable writes


class Writes:
    """os.fsync and renames as they happen (the real calls run): a power loss cannot be made in a
    test, so the test checks that what is published was flushed to disk before it was renamed."""

    def __init__(self, monkeypatch):
        self.events = []
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return real_fsync(fd)

        def replace(src, dst, **kwargs):
            self.events.append(("rename", str(src), str(dst)))
            return real_replace(src, dst, **kwargs)

        def rename(src, dst, **kwargs):
            self.events.append(("rename", str(src), str(dst)))
            return real_rename(src, dst, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def renamed_to(self, final):
        return next(i for i, e in enumerate(self.events) if e[0] == "rename" and e[2] == str(final))

    def synced_before(self, index):
        return {e[1] for e in self.events[:index] if e[0] == "fsync"}

    def synced_after(self, index):
        return {e[1] for e in self.events[index:] if e[0] == "fsync"}


def test_a_checkpoint_is_on_disk_before_it_is_published(tmp_path, monkeypatch):
    writes = Writes(monkeypatch)
    final = checkpoint.save(OutputDir(tmp_path), 4, {"x": torch.tensor([4])}, rank=0, keep=2)
    renamed = writes.renamed_to(final)
    tmp = writes.events[renamed][1]
    files = [p.relative_to(final) for p in final.rglob("*") if p.is_file()]
    assert {"manifest.json", "state.pt", "rng-rank0.pt"} <= {str(f) for f in files}
    assert {f"{tmp}/{f}" for f in files} | {tmp} <= writes.synced_before(renamed)  # contents and entries
    assert str(final.parent) in writes.synced_after(renamed)  # the rename itself


def test_json_files_are_on_disk_before_they_replace_the_old_ones(tmp_path, monkeypatch):
    writes = Writes(monkeypatch)
    fsutil.write_json(tmp_path / "metrics.json", {"a": 1})
    renamed = writes.renamed_to(tmp_path / "metrics.json")
    assert writes.events[renamed][1] in writes.synced_before(renamed)
    assert str(tmp_path) in writes.synced_after(renamed)


@pytest.mark.parametrize("attempts, superseded", [
    ([], None),  # no journal of a job
    ([("r1", None)], "r1"),  # killed: never ended
    ([("r1", "KILLED")], "r1"),  # Ctrl-C before its first checkpoint
    ([("r1", "FAILED")], "r1"),
    ([("r1", "FINISHED")], None),  # finished: overwrite=true keeps its run
    ([("r1", "KILLED"), ("r1", "FINISHED")], None),  # preempted, then resumed to its end
    ([("r1", "FINISHED"), ("r1", None)], "r1"),  # a finished job asked for more, killed
    ([(None, None)], None),  # never reached a store
])
def test_the_run_a_job_starting_over_supersedes_is_the_previous_jobs_if_it_did_not_finish(
        tmp_path, attempts, superseded):
    from pipeline.tracking import journal, unfinished_run

    for run_id, status in attempts:
        journal.append(tmp_path / journal.JOURNAL, journal.start("sqlite:///m.db", "e", "job", {}, {}),
                       journal.run(run_id), *([journal.end(status)] if status else []))
    assert unfinished_run(tmp_path) == superseded


@pytest.mark.parametrize("error, line", [
    (Interrupted("OUT/checkpoints/step-00000010 (step 10) is the last checkpoint", ("resume=auto",)),
     "OUT/checkpoints/step-00000010 (step 10) is the last checkpoint; to continue: python -m pipeline train "
     "task=ner 'data.train=my file.tsv' resume=auto"),
    (KeyboardInterrupt(), "stopped before it finished; to continue: python -m pipeline train task=ner "
                          "'data.train=my file.tsv' resume=never"),
])
def test_ctrl_c_names_what_survived_and_the_same_command_that_continues(error, line):
    from pipeline.cli import interrupted_line

    assert interrupted_line(error, "train", ["task=ner", "data.train=my file.tsv", "resume=never"]) == line
