"""Models train in fp32 whatever dtype a saved config names, and best/ is saved in fp32.

A module that trains in 16 bit (DeepSpeed's bf16/fp16 blocks cast the whole module; on this CPU
its bf16 block does, the fp16 one needs a GPU) writes its own dtype into config.json through a
plain save_pretrained, and transformers 5 loads in the config's dtype: reusing such a directory as
model=, kd.teacher= or from_teacher:N would train 16-bit parameters with no fp32 master copy."""
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig

from pipeline import models
from pipeline.config import load_config
from pipeline.kd import distill
from pipeline.kd.student import from_teacher
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.torch_backend import TorchBackend
from pipeline.runtime.world import Runtime
from pipeline.tasks import get_task

CPU = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
TEXTS = ["আমি ভাত খাই", "সে বই পড়ে", "ভালো লাগল না", "খুব সুন্দর হয়েছে"] * 8


def sixteen_bit_model_dir(tmp_path, fp32_save: bool):
    """A tiny sentiment model that trained as a bf16 module, saved as best/ in fp32 or as a plain save_pretrained."""
    task = get_task("sentiment")
    tokenizer = models.preset_tokenizer(TEXTS, vocab_size=200)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, pad_token_id=tokenizer.pad_token_id, **task.model_kwargs())
    module = task.model_class.from_config(config).to(torch.bfloat16)  # as a 16-bit engine leaves it
    directory = tmp_path / "best"
    if fp32_save:
        models.save_pretrained_fp32(module, module.state_dict(), tokenizer, directory)
    else:  # a plain save_pretrained writes the module's dtype into config.json
        module.save_pretrained(directory, state_dict=module.state_dict())
        tokenizer.save_pretrained(directory)
    return task, directory


def test_best_is_saved_in_fp32_with_a_config_that_says_so(tmp_path):
    _, directory = sixteen_bit_model_dir(tmp_path, fp32_save=True)
    assert json.loads((directory / "config.json").read_text())["dtype"] == "float32"
    assert {t.dtype for t in load_file(directory / "model.safetensors").values() if t.is_floating_point()} == {
        torch.float32}


@pytest.mark.parametrize("fp32_save", [True, False])
def test_a_16bit_trained_model_reloads_as_fp32_everywhere(tmp_path, fp32_save):
    task, directory = sixteen_bit_model_dir(tmp_path, fp32_save)
    if not fp32_save:
        assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"

    _, model = models.build(str(directory), task, [], {}, 48)  # model=best/
    assert {p.dtype for p in model.parameters()} == {torch.float32}

    _, teacher = distill.load_teacher(str(tmp_path), task, {})  # kd.teacher=OUTPUT_DIR (its best/)
    assert {p.dtype for p in teacher.parameters()} == {torch.float32}

    student = from_teacher("from_teacher:1", teacher, task, {})
    assert {p.dtype for p in student.parameters()} == {torch.float32}

    cfg = load_config(None, [f"kd.teacher={tmp_path}", "model=from_teacher:1"])
    bf16 = PrecisionPolicy("bf16", "cpu")
    _, _, student, _ = distill.build_distillation(cfg, task, bf16, CPU, TorchBackend(CPU, bf16, 1.0), [])
    assert {p.dtype for p in student.parameters()} == {torch.float32}


def test_prepared_texts_find_their_preset_tokenizer_without_reading_every_text():
    """The prepared training texts carry the sha256 the preset tokenizer's cache is keyed by, so a
    warm start finds the tokenizer without a pass over every text (pages of a memory-mapped split)."""
    import hashlib

    texts = [f"বাক্য {i} আমার সোনার বাংলা" for i in range(200)]
    built = models.preset_tokenizer(texts, vocab_size=300)
    digest = hashlib.sha256(b"".join(t.encode("utf-8") + b"\0" for t in texts)).hexdigest()

    class PreparedTexts:
        sha256 = digest

        def __iter__(self):
            raise AssertionError("read every text although the hash was given")

    found = models.preset_tokenizer(PreparedTexts(), vocab_size=300)
    assert found.get_vocab() == built.get_vocab()


@pytest.mark.parametrize("spec, local", [
    ("./my-modle", True), ("outputs/nope", True), ("/abs/model", True), ("~/m", True), ("a/b/c", True),
    ("org/name with space", True), ("sentence-transformers/all-MiniLM-L6-v2", False), ("bert-base-uncased", False),
])
def test_a_path_looks_local_where_a_hub_id_would_not(spec, local):
    from pipeline.models import looks_local

    assert looks_local(spec) is local


@pytest.mark.parametrize("override, key", [("model=./my-modle", "model"), ("kd.teacher=outputs/nope", "kd.teacher"),
                                           ("model=outputs/no-such-stage/best", "model")])
def test_a_mistyped_local_path_is_refused_at_once_without_a_hub_call(tmp_path, monkeypatch, override, key):
    import huggingface_hub

    from pipeline.config import load_config
    from pipeline.errors import UserError
    from pipeline.job.run import run

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    cfg = load_config(None, [override, f"output_dir={tmp_path / 'out'}"])
    value = override.split("=", 1)[1]
    with pytest.raises(UserError, match=rf"^config: {key}={value}: no such directory$"):
        run(cfg, "distill" if key == "kd.teacher" else "train")
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_presets_saved_tokenizer_carries_the_models_length(tmp_path):
    """Not transformers' 'unset' (1e30): a pipeline's truncation=True then cuts at the model's positions."""
    from transformers import AutoTokenizer

    task = get_task("sentiment")
    tokenizer, model = models.build("preset:bangla-tiny", task, task.texts(task.load(None, "train")), {}, 48)
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == model.config.max_position_embeddings == 512


def test_max_length_over_the_models_positions_is_refused_before_its_weights_load(tmp_path):
    """train.max_length=1024 on a 512-position model: one line naming both, not a crash in set-up."""
    from pipeline.errors import UserError

    task = get_task("sentiment")
    tokenizer, model = models.build("preset:bangla-tiny", task, task.texts(task.load(None, "train")), {}, 48)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UserError, match=rf"^config: train.max_length=1024: model={tmp_path} takes at most 512 "
                                        r"tokens \(its position embeddings\)$"):
        models.build(str(tmp_path), task, [], {}, 1024)
    with pytest.raises(UserError, match=r"^config: train.max_length=1024: kd.teacher="):
        distill.load_teacher(str(tmp_path), task, {}, 1024)
    assert models.build(str(tmp_path), task, [], {}, 512)[0].model_max_length == 512


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 100}, "config: model_config.hidden_size=100: preset:bangla-base's 6 attention heads must split "
                           "it evenly; would fit: model_config.hidden_size 90, 96, 102, 108 or "
                           "model_config.num_attention_heads 2, 4, 5, 10"),
    ({"num_attention_heads": 5}, "config: model_config.num_attention_heads=5: must divide the hidden size 384; would "
                                 "fit: model_config.num_attention_heads 2, 3, 4, 6 or model_config.hidden_size 375, "
                                 "380, 385, 390"),
])
def test_a_hidden_size_its_heads_cannot_split_is_refused_naming_the_key_given(overrides, message):
    """A preset's width overridden so its heads do not divide it: one line naming the key the user
    set and nearby values that would fit, before the model is built (transformers would raise
    deep inside it)."""
    from pipeline.errors import UserError

    task = get_task("sentiment")
    with pytest.raises(UserError) as e:
        models.build("preset:bangla-base", task, TEXTS, overrides, 48)
    assert str(e.value) == message
