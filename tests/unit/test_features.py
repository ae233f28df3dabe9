"""Prepared data (pipeline/data/features.py): features cached on disk are the features the task makes,
a warm start reads and tokenizes nothing again, the fingerprint follows exactly what changes the
features, an unreadable entry is rebuilt, and under torchrun one rank per node does the work."""
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import ROOT
from pipeline.config import load_config
from pipeline.data import features
from pipeline.errors import UserError
from pipeline.job.plan import settle
from pipeline.models import preset_tokenizer
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task, samples
from pipeline.tasks import workers as base
from pipeline.tasks.base import SPLITS
from pipeline.tasks.sentiment import LABELS

SINGLE = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own: a miss is a miss, whatever other tests prepared."""
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sentiment_files(directory, rows=120, seed=0) -> dict:
    """Small BLP-2023 TSV files (train/dev/test) with spacing the normalizer changes."""
    directory.mkdir(parents=True, exist_ok=True)
    rng, paths = random.Random(seed), {}
    for split in SPLITS:
        lines = [[f"{split}-{i}", "  " + samples.sentiment_sentence(rng, label) + " ।  ", label]
                 for i, label in enumerate(rng.choice(LABELS) for _ in range(rows))]
        paths[split] = samples.write_table(directory / f"{split}.tsv", ["id", "text", "label"], lines, **samples.TSV)
    return paths


def prepare(task, spec, tokenizer=None, max_length=32):
    """What build_stage does with the training split: its entry, the tokenizer, its features."""
    train = features.prepare_train(task, spec, SINGLE)
    tokenizer = tokenizer or preset_tokenizer(train.texts)
    return train, tokenizer, features.prepare_features(task, "train", spec, train, tokenizer, max_length, SINGLE)


def assert_same_columns(a, b):
    assert a.column_names == b.column_names
    for name in a.column_names:  # the Arrow arrays themselves: same values, same types
        assert a.data.column(name).combine_chunks().equals(b.data.column(name).combine_chunks()), name


def test_the_fingerprint_follows_what_changes_the_features(cache, tmp_path, monkeypatch):
    paths = sentiment_files(tmp_path / "a")
    task = get_task("sentiment")
    tokenizer = preset_tokenizer(task.texts(task.load(str(paths["train"]), "train")))

    def keys(spec, task=task, tokenizer=tokenizer, max_length=32):
        source = features.examples_key(task, spec, "train")
        return source, features.features_key(task, source, "train", tokenizer, max_length)

    base = keys(str(paths["train"]))
    copy = tmp_path / "elsewhere.tsv"
    shutil.copy(paths["train"], copy)
    os.utime(copy, (1, 1))
    assert keys(str(copy)) == base  # the content counts, not its path or time
    reloaded = preset_tokenizer(task.texts(task.load(str(copy), "train")))  # a new object, same files
    reloaded("a long sentence to cut " * 20, truncation=True, max_length=8)  # a call that sets truncation
    assert keys(str(copy), tokenizer=reloaded) == base
    assert keys(str(paths["train"]), task=get_task("sentiment", {})) == base

    with monkeypatch.context() as patch:
        patch.setattr(features, "normalizer_version", lambda: "csebuetnlp-normalizer==1.0.1")
        assert keys(str(paths["train"]))[0] != base[0]

    edited = tmp_path / "edited.tsv"
    edited.write_bytes(paths["train"].read_bytes().replace(b"train-7\t", b"train-7x\t"))
    assert keys(str(edited))[0] != base[0] and keys(str(edited))[1] != base[1]
    # edited in place, same size, its time set back: still seen (the remembered hash is not reused)
    stamp = copy.stat()
    copy.write_bytes(paths["train"].read_bytes().replace(b"train-7\t", b"train-8\t"))
    os.utime(copy, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert copy.stat().st_size == stamp.st_size and keys(str(copy))[0] != base[0]
    assert keys(str(paths["train"]), max_length=48) == (base[0], keys(str(paths["train"]), max_length=48)[1])
    assert keys(str(paths["train"]), max_length=48)[1] != base[1]
    other = preset_tokenizer(task.texts(task.load(str(paths["dev"]), "dev")))
    assert keys(str(paths["train"]), tokenizer=other)[1] != base[1]

    error_cls = str(samples.ensure_samples("error_cls", get_task("error_cls").write_samples)["train"])
    five, binary = get_task("error_cls"), get_task("error_cls", {"binary": True})
    assert features.examples_key(five, error_cls, "train") != features.examples_key(binary, error_cls, "train")
    qa = get_task("qa")
    qa_file = str(samples.ensure_samples("qa", qa.write_samples)["train"])
    assert features.examples_key(qa, qa_file, "train") != features.examples_key(get_task("qa", {"stride": 4}),
                                                                                 qa_file, "train")


def test_a_large_training_file_is_read_and_written_piece_by_piece(cache, tmp_path, monkeypatch):
    """The builder reads, validates and normalizes a text-classification file CHUNK_ROWS rows at a
    time and writes each piece before reading the next (a 1M-row file is never all Python objects);
    the entry is the one a whole read gives: same examples, digest, texts' hash and features. A
    bad row in a later piece is the usual one-line error and leaves no entry behind."""
    from pipeline.tasks.text_classification import TextClassificationTask

    paths = sentiment_files(tmp_path / "data")
    whole_task = get_task("sentiment")
    rows = whole_task.load(str(paths["train"]), "train")
    whole_train, tokenizer, whole = prepare(whole_task, str(paths["train"]))
    shutil.rmtree(cache)

    monkeypatch.setattr(TextClassificationTask, "CHUNK_ROWS", 45)  # 120 rows: two whole pieces and a shorter one
    written_before, validate = [], TextClassificationTask._validate

    def counted_validate(self, chunk, where):
        written_before.append(len(list(cache.rglob("pieces/*/examples/dataset_info.json"))))
        return validate(self, chunk, where)

    monkeypatch.setattr(TextClassificationTask, "_validate", counted_validate)
    task = get_task("sentiment")
    assert [len(chunk) for chunk in task.load_chunks(str(paths["train"]), "train")] == [45, 45, 30]
    written_before.clear()
    train, _, pieces = prepare(task, str(paths["train"]), tokenizer)
    assert written_before == [0, 1, 2]  # piece i is on disk before piece i + 1 is read
    assert train.dataset().to_list() == rows and list(train.texts) == task.texts(rows)
    assert (len(train), train.digest, train.texts.sha256) == (len(whole_train), whole_train.digest,
                                                             whole_train.texts.sha256)
    assert_same_columns(pieces, whole)
    assert not list(cache.rglob("pieces"))

    shutil.rmtree(cache)
    bad = tmp_path / "bad.tsv"
    lines = paths["train"].read_text(encoding="utf-8").splitlines()
    lines[100] = lines[100].rsplit("\t", 1)[0] + "\tMixed"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^\S*bad.tsv: line 101: unknown label 'Mixed'"):
        features.prepare_train(get_task("sentiment"), str(bad), SINGLE)
    assert written_before[-1] == 2  # it failed in the 3rd piece, with 2 written
    assert [p.name for p in (cache / "features").iterdir()] == ["sources"]  # nothing half-written


def test_a_bad_row_read_by_a_worker_is_the_same_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(base, "PARALLEL_ROWS", 100)
    task = get_task("qa")
    lines = samples.ensure_samples("qa", task.write_samples)["train"].read_text().splitlines()
    row = json.loads(lines[700])
    row["answers"]["answer_start"] = [len(row["context"]) + 5]
    row["answers"]["text"] = ["x"]
    lines[700] = json.dumps(row, ensure_ascii=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl: line 701: answer_start \d+ does not match the context"):
        task.load(str(bad), "train")


def stage_config(paths, tmp_path, *extra):
    return load_config(None, ["model=preset:bangla-tiny", "train.max_length=32", f"output_dir={tmp_path / 'out'}",
                              *(f"data.{split}={paths[split]}" for split in SPLITS), *extra])


def counting(monkeypatch):
    """Count the task's file reads (per path) and featurize calls (per split)."""
    from pipeline.tasks.text_classification import TextClassificationTask

    calls = {"read": [], "featurize": []}
    read, featurize = TextClassificationTask.table_rows, TextClassificationTask.featurize

    def counted_read(self, path):
        calls["read"].append(path.name)
        return read(self, path)

    def counted_featurize(self, examples, tokenizer, max_length, split):
        calls["featurize"].append(split)
        return featurize(self, examples, tokenizer, max_length, split)

    monkeypatch.setattr(TextClassificationTask, "table_rows", counted_read)
    monkeypatch.setattr(TextClassificationTask, "featurize", counted_featurize)
    return calls


def test_a_warm_stage_neither_reads_the_training_file_nor_tokenizes(cache, tmp_path, monkeypatch):
    """The second stage with the same fingerprint memory-maps every split's features; the training
    rows are never read again (dev/test are: the metrics need their examples); another max_length
    tokenizes again, without reading the training file again."""
    from pipeline.job.stage import build_stage

    def planned(cfg, rt):
        return (settle(cfg, "train", rt),)

    paths = sentiment_files(tmp_path / "data")
    calls = counting(monkeypatch)
    cold = build_stage(*planned(stage_config(paths, tmp_path), SINGLE))
    assert sorted(calls["featurize"]) == ["dev", "test", "train"] and "train.tsv" in calls["read"]
    assert features.cache_outcome(cold.examples["train"], cold.features) == "miss"

    calls["read"].clear(), calls["featurize"].clear()
    warm = build_stage(*planned(stage_config(paths, tmp_path), SINGLE))
    assert calls == {"read": ["dev.tsv", "test.tsv"], "featurize": []}
    for split in SPLITS:
        assert_same_columns(warm.features[split], cold.features[split])
    assert len(warm.examples["train"]) == 120
    assert features.cache_outcome(warm.examples["train"], warm.features) == "hit"

    calls["read"].clear()
    shorter = build_stage(*planned(stage_config(paths, tmp_path, "train.max_length=24"), SINGLE))
    assert calls == {"read": ["dev.tsv", "test.tsv"], "featurize": ["train", "dev", "test"]}
    assert features.cache_outcome(shorter.examples["train"], shorter.features) == "partial"


@pytest.mark.parametrize("damage", ["truncated arrow file", "no meta.json", "half-written meta.json",
                                    "missing texts"])
def test_an_unreadable_entry_is_built_again(cache, tmp_path, monkeypatch, damage):
    paths = sentiment_files(tmp_path / "data")
    spec = str(paths["train"])
    _, tokenizer, good = prepare(get_task("sentiment"), spec)
    (examples_entry,) = cache.glob("features/examples-*")
    (features_entry,) = cache.glob("features/train-*")
    if damage == "truncated arrow file":
        (arrow,) = (features_entry / "data").glob("*.arrow")
        head = arrow.read_bytes()[:100]
        arrow.unlink()  # a new, short file (a copy cut off): `good` still maps the old one
        arrow.write_bytes(head)
    elif damage == "no meta.json":
        (features_entry / "meta.json").unlink()
    elif damage == "half-written meta.json":
        (examples_entry / "meta.json").write_text('{"format": 1, "key": ')
    else:
        shutil.rmtree(examples_entry / "texts")

    calls = counting(monkeypatch)
    _, _, again = prepare(get_task("sentiment"), spec, tokenizer)
    assert_same_columns(again, good)
    rebuilt = {"examples": ["train.tsv"], "features": ["train"]}
    if damage in ("half-written meta.json", "missing texts"):  # the examples again; the features still fit
        assert calls == {"read": rebuilt["examples"], "featurize": []}
    else:  # the features again, from the cached examples: the file is not read
        assert calls == {"read": [], "featurize": rebuilt["features"]}
    entries = sorted(p.name.split("-")[0] for p in (cache / "features").iterdir() if p.name != "sources")
    assert entries == ["examples", "train"]


def test_a_bad_training_file_is_one_line_naming_it(cache, tmp_path):
    paths = sentiment_files(tmp_path / "data")
    bad = tmp_path / "bad.tsv"
    bad.write_text(paths["train"].read_text().replace("\tNegative\n", "\tAngry\n", 1))
    with pytest.raises(Exception, match=r"bad.tsv: line \d+: unknown label 'Angry'"):
        features.prepare_train(get_task("sentiment"), str(bad), SINGLE)
    assert [p.name for p in (cache / "features").iterdir()] == ["sources"]  # only the file's hash: no entry


def test_a_killed_builders_leftovers_go_at_the_next_build(tmp_path):
    """A builder killed mid-write (SIGKILL: no cleanup runs) leaves its temporary folder; the next
    write of the same entry on this host removes it, and leaves alone a live writer's."""
    from pipeline import fsutil

    final = tmp_path / "features" / "train-abc"
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pipeline.fsutil import atomic_dir
        with atomic_dir(Path({str(final)!r})) as tmp:
            (tmp / "part").write_text("half")
            print(tmp, flush=True)
            time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    leftover = child.stdout.readline().strip()
    child.kill()
    child.wait()
    live = final.parent / f".{final.name}.tmp-{fsutil._HOST}-{os.getpid()}-x"  # a writer still at work
    live.mkdir()
    assert os.path.isdir(leftover)
    with fsutil.atomic_dir(final) as tmp:
        (tmp / "part").write_text("whole")
    assert not os.path.exists(leftover) and live.is_dir()
    assert (final / "part").read_text() == "whole"
