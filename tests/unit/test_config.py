"""Config: YAML + dotted overrides, typed; every mistake is one line naming the key (exit 2)."""
import pytest

from helpers import settled_config
from pipeline.config import flatten, load_config
from pipeline.errors import UserError
from pipeline.tasks import get_task


def test_defaults_and_overrides_are_typed(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("task: sentiment\ntrain:\n  lr: 1e-4\n  epochs: 2\n")  # YAML reads 1e-4 as text
    cfg = load_config(str(cfg_file), ["train.batch_size=8", "precision=bf16", "kd.cache=false",
                                      "data.dev=null", "model_config.hidden_dropout_prob=0.0"])
    assert cfg.train.lr == pytest.approx(1e-4) and isinstance(cfg.train.lr, float)
    assert cfg.train.epochs == 2 and cfg.train.batch_size == 8
    assert cfg.precision == "bf16" and cfg.kd.cache is False and cfg.data.dev is None
    assert cfg.model_config == {"hidden_dropout_prob": 0.0}
    assert cfg.output_dir is None  # as the user left it; the job settles it
    settled = settled_config(cfg, "preset:bangla-tiny", get_task("sentiment"))
    assert settled.output_dir == "outputs/sentiment-bangla-tiny-bf16"
    assert flatten(cfg.to_dict())["train.lr"] == pytest.approx(1e-4)


@pytest.mark.parametrize("task, override, grouped", [
    ("sentiment", [], True), ("error_cls", [], True),  # kept the dev score within the seed spread
    ("ner", [], False), ("wikiqa", [], False), ("qa", [], False),  # lowered it, or not measured
    ("sentiment", ["train.group_by_length=false"], False), ("ner", ["train.group_by_length=true"], True),
])
def test_length_grouping_defaults_to_the_tasks_choice_and_an_explicit_value_wins(task, override, grouped):
    cfg = load_config(None, [f"task={task}", *override])
    assert settled_config(cfg, "preset:bangla-tiny", get_task(task)).train.group_by_length is grouped


@pytest.mark.parametrize("overrides, fragment", [
    (["train.foo=1"], "unknown key 'train.foo'"),
    (["nosuch=1"], "unknown key 'nosuch'"),
    (["train.lr=0"], "train.lr=0.0: must be > 0"),
    (["train.lr=-1e-3"], "train.lr=-0.001: must be > 0"),
    (["train.batch_size=0"], "train.batch_size=0: must be >= 1"),
    (["train.batch_size=abc"], "train.batch_size='abc': expected int"),
    (["train.epochs=1.5"], "train.epochs='1.5': expected int"),
    (["precision=fp8"], "precision=fp8: must be one of"),
    (["backend=horovod"], "backend=horovod: must be one of"),
    (["task=pos"], "task=pos: must be one of"),
    (["kd.alpha=2"], "kd.alpha=2.0: must be in [0, 1]"),
    (["kd.hidden_weight=-1"], "kd.hidden_weight=-1.0: must be >= 0 (0 = off)"),
    (["train.warmup_ratio=1"], "train.warmup_ratio=1.0: must be in [0, 1)"),
    (["kd.cache=maybe"], "kd.cache='maybe': expected bool"),
    (["train=3"], "train: is a section"),
    (["lr"], "expected key=value"),
    (["deepspeed=/nonexistent/ds.json"], "deepspeed=/nonexistent/ds.json: no such file"),
])
def test_bad_overrides_name_the_key(overrides, fragment):
    with pytest.raises(UserError, match=None) as e:
        load_config(None, overrides)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_yaml_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  learning_rate: 0.1\n")
    with pytest.raises(UserError, match="unknown key 'train.learning_rate'"):
        load_config(str(typo))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train:\n  epochs: true\n")
    with pytest.raises(UserError, match="train.epochs=True: expected int"):
        load_config(str(wrong))
    wrong.write_text("train:\n  batch_size: '16'\n")
    with pytest.raises(UserError, match="train.batch_size='16': expected int"):
        load_config(str(wrong))
    with pytest.raises(UserError, match="no such file"):
        load_config(str(tmp_path / "missing.yaml"))


def test_secret_looking_keys_are_masked_and_token_counts_are_not():
    from pipeline.config.secrets import redact_config

    got = redact_config({"hf_token": "hf_x", "api_key": "k", "tracking": {"password": "p", "client_secrets": "s"},
                         "train": {"batch_tokens": 4096, "max_tokens": 128}, "uri": "http://u:pw@host:5000"})
    assert got == {"hf_token": "***", "api_key": "***", "tracking": {"password": "***", "client_secrets": "***"},
                   "train": {"batch_tokens": 4096, "max_tokens": 128}, "uri": "http://***@host:5000"}


@pytest.mark.parametrize("given,missing", [(["data.train=mine.tsv"], "dev"),
                                           (["data.train=mine.tsv", "data.test=test.tsv"], "dev"),
                                           (["data.dev=dev.tsv", "data.test=test.tsv"], "train")])
def test_a_users_data_with_a_split_left_to_the_samples_is_refused(given, missing):
    """A user's file beside an unset train or dev split would be trained with (or judged on) the
    built-in synthetic set without a word: one line naming the split, what it is for, and the ways on."""
    with pytest.raises(UserError) as e:
        load_config(None, given)
    message = str(e.value)
    assert message.startswith(f"config: data.{missing}: unset while data.") and "\n" not in message
    assert f"give data.{missing}=FILE (or hub:ID)" in message
    assert f"or data.{missing}=samples to use that set knowingly" in message
    assert ("data.dev=holdout:F (a fraction of the training rows) or data.dev=skip" in message) == (missing == "dev")


def test_a_held_out_dev_split_no_dev_and_no_test_are_what_the_config_says():
    held = load_config(None, ["data.train=mine.tsv", "data.dev=holdout:0.2"]).data
    assert held.holdout() == (0.2, 0) and not held.reads("dev") and held.evaluates("dev")
    assert not held.evaluates("test")  # test unset beside a given key: no test figures, not the samples
    assert load_config(None, ["data.train=mine.tsv", "data.dev=holdout:0.1:7"]).data.holdout() == (0.1, 7)
    skipped = load_config(None, ["data.train=mine.tsv", "data.dev=skip", "data.test=t.tsv"]).data
    assert not skipped.evaluates("dev") and skipped.evaluates("test") and skipped.source("test") == "t.tsv"
    assert load_config(None, []).data.evaluates("test")  # no data key: every split is the sample set's


@pytest.mark.parametrize("overrides,message", [
    (["data.dev=holdout:1.5"], "config: data.dev=holdout:1.5: holdout:F[:SEED] holds out a fraction 0 < F < 1"),
    (["data.dev=holdout:x"], "config: data.dev=holdout:x: holdout:F[:SEED]"),
    (["data.dev=holdout:0.1:-1"], "config: data.dev=holdout:0.1:-1: holdout:F[:SEED]"),
    (["data.dev=skip", "train.patience=2"], "config: train.patience=2: evaluates dev, and data.dev=skip"),
    (["data.dev=skip", "train.eval_every=50"], "config: train.eval_every=50: evaluates dev, and data.dev=skip"),
])
def test_a_bad_held_out_split_or_an_evaluation_without_dev_is_one_line(overrides, message):
    with pytest.raises(UserError) as e:
        load_config(None, ["data.train=mine.tsv", *overrides])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_held_out_rows_are_a_seeded_draw_the_same_for_every_job_seed():
    from pipeline.data.holdout import held_out_rows

    rows = held_out_rows(range(1000), 0.1, 0)
    assert len(rows) == 100 and list(rows) == sorted(set(rows)) and rows.max() < 1000
    assert list(rows) == list(held_out_rows(range(1000), 0.1, 0))  # every rank, every resume
    assert list(rows) != list(held_out_rows(range(1000), 0.1, 1))  # another SEED, another draw
    assert len(held_out_rows(range(3), 0.01, 0)) == 1 and len(held_out_rows(range(3), 0.99, 0)) == 2  # 1 to all-1


def test_a_group_of_rows_is_held_out_whole():
    """WikiQA's candidates of one question: all in dev or all in training, never split."""
    from pipeline.data.holdout import held_out_rows
    from pipeline.tasks import get_task

    assert get_task("wikiqa", {}).holdout_group == "qid" and get_task("sentiment", {}).holdout_group is None
    groups = [f"q{i // 3}" for i in range(60)]  # 20 questions of 3 candidates
    held = set(held_out_rows(groups, 0.25, 1).tolist())
    held_groups = {groups[i] for i in held}
    assert len(held_groups) == 5 and len(held) == 15
    assert not held_groups & {group for i, group in enumerate(groups) if i not in held}


def test_the_samples_are_used_when_no_data_key_is_given_or_by_name():
    assert [load_config(None, []).data.source(s) for s in ("train", "dev", "test")] == [None, None, None]
    cfg = load_config(None, ["data.train=mine.tsv", "data.dev=samples", "data.test=hub:x/y"])
    assert [cfg.data.source(s) for s in ("train", "dev", "test")] == ["mine.tsv", None, "hub:x/y"]
