"""The four model families the studies name, under their hub ids, offline: BanglaBERT and
BanglishBERT (ELECTRA discriminators), XLM-R (Unigram/Metaspace tokenizer, no token_type_ids) and
mBERT (cased WordPiece) through every task, distillation (from_teacher:N and its teacher-logit
cache, the hidden-state term across widths), DeepSpeed ZeRO-2, the csebuetnlp normalizer rule,
and checkpoints whose head does not fit the task.

The models are tiny random ones of each family's architecture (tests/model_families.py), built
once for this module into a folder laid out as the Hugging Face cache. huggingface_hub reads
HF_HUB_OFFLINE and HF_HUB_CACHE when it is imported, which has happened by the time this module
runs: the in-process stages get both by patching huggingface_hub.constants, the module attributes
that file_download and transformers read at every call (the loading code itself is untouched);
the environment variables are set as well, for the DeepSpeed launcher's fresh processes.
"""
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from helpers import deepspeed, mlflow_runs
from model_families import (
    BANGLABERT,
    BANGLISHBERT,
    FAMILIES,
    MBERT,
    MODEL_TYPE,
    NARROW,
    SIZES,
    XLMR,
    build_hub_cache,
    write_narrow,
)
from pipeline import cli, models, names
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.fsutil import cache_root
from pipeline.job.run import run
from pipeline.kd import distill
from pipeline.tasks import REGISTRY, get_task

pytestmark = pytest.mark.slow

JOB = ["train.max_length=48", "train.batch_size=16", "train.max_steps=2", "train.eval_batch_size=128",
       "tracking.system_metrics=false", "infer.bench=false"]
CLASS_PREFIX = {"electra": "Electra", "xlm-roberta": "XLMRoberta", "bert": "Bert"}
HEAD = {"sentiment": "ForSequenceClassification", "ner": "ForTokenClassification",
        "error_cls": "ForSequenceClassification", "qa": "ForQuestionAnswering", "wikiqa": "ForSequenceClassification"}
INPUTS = {"xlm-roberta": ["input_ids", "attention_mask"]}  # the others also take token_type_ids


@dataclass
class Hub:
    root: Path
    snapshots: dict
    db: Path

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.db}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    texts = [text for name in REGISTRY for task in [get_task(name)] for text in task.texts(task.load(None, "train"))]
    snapshots = build_hub_cache(root / "hub", texts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # fresh processes read these when they import huggingface_hub
        mp.setenv("HF_HUB_CACHE", str(root / "hub"))
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # this process has imported it
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root / "hub"))
        yield Hub(root, snapshots, root / "mlflow.db")


def slug(family: str) -> str:
    return family.replace("/", "-")


def stage(hub: Hub, command: str, experiment: str, *overrides) -> tuple[Path, dict]:
    """One stage in this process; (output_dir, final figures)."""
    out = hub.root / "out" / experiment
    cfg = load_config(None, [*JOB, *overrides, f"output_dir={out}", f"tracking.uri={hub.uri}",
                             f"tracking.experiment={experiment}"])
    return out, run(cfg, kind=command)


@pytest.fixture(scope="module")
def trained(hub):
    """family, task -> (output_dir, figures) of a train stage from the hub id, run once."""
    done = {}

    def train(family: str, task: str):
        if (family, task) not in done:
            done[family, task] = stage(hub, "train", f"{slug(family)}-{task}", f"task={task}", f"model={family}")
        return done[family, task]

    return train


def only_run(hub: Hub, experiment: str):
    (mlrun,) = mlflow_runs(hub.db, experiment)
    return mlrun


# ---------------------------------------------------------------------- every task, every family


@pytest.mark.parametrize("task", list(REGISTRY))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_task_trains_from_the_hub_id(trained, family, task):
    out, figures = trained(family, task)
    assert math.isfinite(figures[names.TEST_MAIN])
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE[family]
    assert config["architectures"] == [CLASS_PREFIX[MODEL_TYPE[family]] + HEAD[task]]
    tokenizer = AutoTokenizer.from_pretrained(out / "best")
    assert tokenizer.model_input_names == INPUTS.get(MODEL_TYPE[family], ["input_ids", "token_type_ids",
                                                                          "attention_mask"])


# ---------------------------------------------------------------------- distillation


@pytest.mark.parametrize("family", FAMILIES)
def test_distill_from_teacher_over_each_family(hub, trained, family):
    teacher, _ = trained(family, "sentiment")
    out, figures = stage(hub, "distill", f"kd-{slug(family)}", "model=from_teacher:1", f"kd.teacher={teacher}")
    assert math.isfinite(figures[names.TEST_MAIN]) and figures[names.TRAIN_STEPS] == 2
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE[family] and config["num_hidden_layers"] == 1
    assert only_run(hub, f"kd-{slug(family)}").data.tags[names.TAG_KD_CACHE] == "miss"


def test_hidden_state_term_from_a_narrower_student(hub, trained, caplog):
    """BanglaBERT's teacher and a narrower ELECTRA student with its vocabulary (a local directory):
    the hidden-state term goes through a learned projection, which best/ leaves out."""
    caplog.set_level(logging.INFO, logger="pipeline")
    teacher, _ = trained(BANGLABERT, "sentiment")
    narrow = write_narrow(BANGLABERT, hub.snapshots[BANGLABERT], hub.root / "banglabert-narrow")
    out, figures = stage(hub, "distill", "kd-hidden", f"model={narrow}", f"kd.teacher={teacher}",
                         "kd.hidden_weight=1.0")
    narrow_width, width = NARROW["hidden_size"], SIZES["hidden_size"]
    assert f"hidden states through learned projections {narrow_width} -> {width}" in caplog.text
    assert math.isfinite(figures[names.TRAIN_LOSS])
    saved = load_file(out / "best" / "model.safetensors")
    assert not any(k.startswith("kd_projection") for k in saved)
    assert saved["electra.embeddings.word_embeddings.weight"].shape[1] == narrow_width
    assert only_run(hub, "kd-hidden").data.tags[names.TAG_KD_CACHE] == "off"  # live teacher: hidden states


def test_deepspeed_zero2_distill_from_the_hub_id_and_the_teacher_cache(hub, trained):
    """An XLM-R student from its hub id distilled twice from the same teacher: in this process
    (the teacher's logits computed and cached), then under the deepspeed launcher, whose fresh
    processes find the hub cache through the environment and the logits in the cache."""
    teacher, _ = trained(XLMR, "sentiment")
    job = [f"model={XLMR}", f"kd.teacher={teacher}"]
    # the from_teacher test above filled this key already (same teacher, same token ids): start empty
    shutil.rmtree(cache_root() / "teacher_logits", ignore_errors=True)
    stage(hub, "distill", "kd-cache-fill", *job)
    assert only_run(hub, "kd-cache-fill").data.tags[names.TAG_KD_CACHE] == "miss"
    out = hub.root / "out" / "kd-deepspeed"
    code, log = deepspeed("distill", *JOB, *job, "deepspeed=ds_configs/zero2.json", f"output_dir={out}",
                          f"tracking.uri={hub.uri}", "tracking.experiment=kd-deepspeed")
    assert code == 0, log[-3000:]
    assert json.loads((out / "deepspeed_config.json").read_text())["zero_optimization"]["stage"] == 2
    tags = only_run(hub, "kd-deepspeed").data.tags
    assert tags["backend"] == "deepspeed" and tags["world_size"] == "2" and tags[names.TAG_KD_CACHE] == "hit"
    assert json.loads((out / "best" / "config.json").read_text())["model_type"] == "xlm-roberta"


# ---------------------------------------------------------------------- the csebuetnlp normalizer

RAW = "\u201c"  # a curly quote: the csebuetnlp normalizer makes it a straight one
QA_CONTEXT = "মিতু \u201cআম\u201d খায়।"
SAMPLE_FILES = {  # one example per Bangla task whose text holds curly quotes, in the task's format
    "sentiment": ("train.tsv", "id\ttext\tlabel\n1\tখাবারটা \u201cদারুণ\u201d ছিল\tPositive\n"),
    "error_cls": ("train.csv", "Comment,Error,Category\nআমি \u201cভাত\u201d খাই,0,\n"),
    "ner": ("train.json", json.dumps([{"text": "আমার \u201cজ্বর\u201d আছে", "labels": ["O", "B-Symptom", "O"]}],
                                     ensure_ascii=False)),
    "qa": ("train.jsonl", json.dumps({"id": "q1", "title": "t", "context": QA_CONTEXT,
                                      "question": "মিতু \u201cকী\u201d খায়?",
                                      "answers": {"text": ["আম"], "answer_start": [QA_CONTEXT.index("আম")]}},
                                     ensure_ascii=False)),
}


@pytest.mark.parametrize("task_name", list(SAMPLE_FILES))
@pytest.mark.parametrize("family", [BANGLABERT, BANGLISHBERT])
def test_csebuetnlp_models_see_normalized_text(hub, tmp_path, family, task_name):
    """The BanglaBERT/BanglishBERT model cards: text must go through the csebuetnlp normalizer
    before the tokenizer, as it did in pretraining; the tokenizer does not do it itself. The
    four Bangla tasks do it (wikiqa, an English dataset, reads its text as it is)."""
    task, (name, content) = get_task(task_name), SAMPLE_FILES[task_name]
    (tmp_path / name).write_text(content, encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(family)
    ids = set(task.featurize(task.load(str(tmp_path / name), "train"), tokenizer, 48, "train")[0]["input_ids"])
    curly, straight = tokenizer.convert_tokens_to_ids([RAW, '"'])
    assert tokenizer.unk_token_id not in (curly, straight)  # both quotes are in the vocabulary
    assert curly in set(tokenizer(RAW)["input_ids"])  # raw text would reach the model as it is
    assert straight in ids and curly not in ids


# ---------------------------------------------------------------------- a head that does not fit


def test_a_head_of_another_size_is_replaced_with_a_one_line_warning(hub, trained, caplog, tmp_path):
    """A fine-tuned 2-label model (XLM-R on WikiQA) given to 3-class sentiment: the encoder is
    the checkpoint's, the head a new one of 3, and one warning line names both sizes."""
    wikiqa, _ = trained(XLMR, "wikiqa")
    caplog.set_level(logging.WARNING, logger="pipeline")
    _, model = models.build(str(wikiqa / "best"), get_task("sentiment"), [], {}, 48)
    saved = load_file(wikiqa / "best" / "model.safetensors")
    embeddings = "roberta.embeddings.word_embeddings.weight"
    assert torch.equal(model.state_dict()[embeddings], saved[embeddings])  # the encoder is the checkpoint's
    assert model.classifier.out_proj.out_features == 3 and saved["classifier.out_proj.weight"].shape[0] == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "pipeline"]
    assert "2-label head" in warning and "(3 labels)" in warning and "\n" not in warning

    caplog.clear()  # and the user's path, the CLI: it trains
    code = cli.main(["train", *JOB, "task=sentiment", f"model={wikiqa / 'best'}", f"output_dir={tmp_path / 'out'}",
                     f"tracking.uri={hub.uri}", "tracking.experiment=another-head"])
    assert code == 0
    warned = [r.getMessage() for r in caplog.records if r.name == "pipeline" and r.levelno >= logging.WARNING]
    assert [w for w in warned if not w.startswith("stalled:")] == [warning]  # a few steps may end stalled
    assert len(json.loads((tmp_path / "out" / "best" / "config.json").read_text())["id2label"]) == 3


def test_a_teacher_whose_head_does_not_fit_the_task_is_refused(hub, trained, capsys, tmp_path):
    """A new head would make the teacher's logits noise: exit 2, one line, nothing written."""
    wikiqa, _ = trained(XLMR, "wikiqa")
    capsys.readouterr()  # what the fixture's training printed: only the CLI's output is checked
    code = cli.main(["distill", *JOB, "task=sentiment", "model=from_teacher:1", f"kd.teacher={wikiqa}",
                     f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: config: kd.teacher={wikiqa / 'best'}: its 2-label head does not fit task "
                           "sentiment (3 labels)")
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.db").exists()

    binary = get_task("error_cls", {"binary": True})  # 2 labels too, but not WikiQA's
    with pytest.raises(UserError, match=r"trained for labels incorrect, correct, task error_cls has Correct, Error"):
        distill.load_teacher(str(wikiqa), binary, {})


def test_a_teacher_without_a_trained_head_is_named_in_a_warning(hub, caplog):
    """A base checkpoint as kd.teacher gets a random head: allowed (benchmarks time KD with one),
    but said, since its logits teach nothing about the task."""
    caplog.set_level(logging.WARNING, logger="pipeline")
    distill.load_teacher(MBERT, get_task("sentiment"), {})
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "pipeline"]
    assert warning.startswith(f"kd.teacher={MBERT}: no trained sentiment head")


def test_an_override_that_changes_an_encoder_size_is_refused(hub):
    """model_config.hidden_size on a pretrained checkpoint would reinitialise the whole encoder:
    refused with the weight and both shapes, never a traceback."""
    with pytest.raises(UserError, match=r"config: model=csebuetnlp/banglabert: electra\.\S+ is \[\d+(, \d+)*\] in "
                                        r"the checkpoint but \[\d+(, \d+)*\] in the model"):
        models.build(BANGLABERT, get_task("sentiment"), [], {"hidden_size": 64}, 48)
