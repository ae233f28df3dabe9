"""Prepared data (pipeline/data/features.py): the tests that train a model or start a process (the
others are in tests/unit/test_features.py)."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT
from pipeline.models import preset_tokenizer
from pipeline.tasks import get_task
from pipeline.tasks import workers as base
from unit.test_features import SINGLE, assert_same_columns, cache, prepare, sentiment_files  # noqa: F401


@pytest.mark.parametrize("task_name", ["sentiment", "ner", pytest.param("qa", marks=pytest.mark.slow),  # QA: over 2 s
                                       "error_cls", "wikiqa"])
def test_cached_features_are_the_features_the_task_makes(cache, task_name):
    """Cold (built) and warm (memory-mapped) features equal task.featurize over the examples as
    read, column by column; the tokenizer trained on the cached texts is the one the rows give."""
    direct_task = get_task(task_name)
    rows = direct_task.load(None, "train")
    tokenizer = preset_tokenizer(direct_task.texts(rows))
    direct = direct_task.featurize(rows, tokenizer, 32, "train")

    cold_train, cold_tokenizer, cold = prepare(get_task(task_name), None)
    warm_task = get_task(task_name)
    warm_train, _, warm = prepare(warm_task, None)
    assert cold_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert_same_columns(cold, direct)
    assert_same_columns(warm, direct)
    as_read = json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str)  # describe_datasets' digest
    assert len(warm_train) == len(rows) and warm_train.digest == hashlib.sha256(as_read.encode()).hexdigest()[:16]
    assert warm_task.state() == direct_task.state()  # NER's tag set, the predictions' width
    assert (cold_train.cache_outcome, cold.cache_outcome, warm_train.cache_outcome, warm.cache_outcome) == (
        "miss", "miss", "hit", "hit")  # the entries read back whole: nothing was built twice
    # sentiment and error_cls tokenize the memory-mapped examples: datasets' map must not leave
    # its cache file inside the published examples entry
    assert not [p.name for p in (cache / "features").rglob("*") if p.name.startswith("cache-")]
    # the texts' hash is the one a preset tokenizer is cached under (so it can skip hashing them)
    assert list((cache / "tokenizers").glob(f"{warm_train.texts.sha256[:16]}-*"))


@pytest.mark.slow  # starts worker processes
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="worker processes need 2 cores")
@pytest.mark.parametrize("task_name", ["ner", "qa"])  # normalized word by word; per example
def test_worker_processes_read_and_tokenize_as_one_process_does(monkeypatch, task_name):
    """Above PARALLEL_ROWS rows, normalization (a pool) and tokenization (datasets' num_proc) run
    in worker processes: the same examples and features as in-process (lowered here to 100 rows)."""
    task = get_task(task_name)
    rows = task.load(None, "train")
    tokenizer = preset_tokenizer(task.texts(rows))
    serial = task.featurize(rows, tokenizer, 32, "train")
    monkeypatch.setattr(base, "PARALLEL_ROWS", 100)
    assert base.worker_count(len(rows)) > 1
    parallel_task = get_task(task_name)
    parallel_rows = parallel_task.load(None, "train")
    assert parallel_rows == rows
    assert_same_columns(parallel_task.featurize(parallel_rows, tokenizer, 32, "train"), serial)


RANK_SCRIPT = """
import json, os, sys
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.errors import UserError
from pipeline.runtime import world
from pipeline.tasks.text_classification import TextClassificationTask
from pipeline.job.plan import settle
from pipeline.job.stage import build_stage

calls = []
featurize = TextClassificationTask.featurize
TextClassificationTask.featurize = lambda self, *a: calls.append(a[-1]) or featurize(self, *a)
data, out = sys.argv[1], sys.argv[2]
cfg = load_config(None, ["model=preset:bangla-tiny", "train.max_length=32", "backend=ddp", f"output_dir={out}",
                         *(f"data.{s}={data}/{s}.tsv" for s in ("train", "dev", "test"))])
rt = world.init("ddp")
s = build_stage(settle(cfg, "train", rt))
report = {"rank": rt.rank, "featurize": calls, "rows": len(s.features["train"]),
          "ids": sum(map(sum, s.features["train"]["input_ids"]))}
try:  # a bad training file: local rank 0 reads it, every rank fails with its line
    build_stage(settle(load_config(None, [f"data.train={data}/bad.tsv",
                                          "data.dev=samples", "data.test=samples", f"output_dir={out}"]), "train", rt))
except UserError as e:
    report["error"] = str(e)
with open(f"{out}-rank{rt.rank}.json", "w") as f:
    json.dump(report, f)
world.shutdown()
"""


@pytest.mark.slow
def test_two_ranks_on_one_node_prepare_the_data_once(cache, tmp_path):
    """torchrun, 2 processes: local rank 0 reads and tokenizes, rank 1 only memory-maps the same
    features; a bad training file fails both ranks with the reader's line, neither waits out the
    process-group timeout."""
    paths = sentiment_files(tmp_path / "data")
    (tmp_path / "data" / "bad.tsv").write_text(paths["train"].read_text().replace("\tNeutral\n", "\t\n", 1))
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(script), str(tmp_path / "data"), str(tmp_path / "out")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"out-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["featurize"] for r in reports] == [["train", "dev", "test"], []]
    assert reports[0]["rows"] == reports[1]["rows"] == 120 and reports[0]["ids"] == reports[1]["ids"]
    for r in reports:
        assert "bad.tsv: line" in r["error"] and "unknown label" in r["error"], r
