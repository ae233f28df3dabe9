"""A Hugging Face Trainer user's names: docs/configuration.md's table and the hint after an unknown
key come from one table (pipeline/config/trainer_names.py), and every entry names a key that exists."""
import pytest

from helpers import ROOT
from pipeline.config import Config, load_config
from pipeline.config.keys import dotted_keys
from pipeline.config.trainer_names import TRAINER_NAMES
from pipeline.errors import UserError

KEYS = set(dotted_keys(Config))


def refusal(override: str) -> str:
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("entry", TRAINER_NAMES, ids=[t.name for t in TRAINER_NAMES])
def test_each_trainer_name_points_to_a_key_that_exists_and_its_hint_says_so(entry):
    if entry.setting is not None:
        assert entry.key in KEYS, entry
        if "=" in entry.setting:
            load_config(None, [entry.setting])  # a value this key takes
    # a name that is a key here too (seed, output_dir) is still answered where it is not one
    word = entry.name if entry.name not in KEYS else f"kd.{entry.name}"
    message = refusal(f"{word}=1")
    assert message.startswith(f"config: unknown key '{word}' (")
    if entry.setting is None:
        assert f"Trainer's {entry.name} has no key here: {entry.differs})" in message
    else:
        assert message.endswith(f"(did you mean {entry.setting}? as the Hugging Face Trainer's {entry.name}: "
                                "docs/configuration.md)")


@pytest.mark.parametrize("override, key", [
    ("per_device_train_batch_size=8", "train.batch_size"),
    ("save_steps=500", "train.save_every"),
    ("eval_steps=500", "train.eval_every"),
    ("resume_from_checkpoint=outputs/x/checkpoints/step-00000010", "resume"),
    ("overwrite_output_dir=true", "overwrite"),
    ("learning_rate=1e-4", "train.lr"),
    ("train.learning_rate=1e-4", "train.lr"),  # in the right section, under the Trainer's name
    ("num_train_epochs=3", "train.epochs"),
    ("gradient_accumulation_steps=4", "train.grad_accum"),
    ("fp16=true", "precision=fp16"),
    ("bf16=true", "precision=bf16"),
    ("logging_steps=50", "train.log_every"),
    ("save_total_limit=3", "train.keep_checkpoints"),
])
def test_the_trainer_names_users_type_first_get_the_right_key(override, key):
    assert f"(did you mean {key}? " in refusal(override)


def test_a_trainer_name_in_a_config_file_gets_the_same_hint(tmp_path):
    path = tmp_path / "hf.yaml"
    path.write_text("train:\n  per_device_train_batch_size: 8\n")
    with pytest.raises(UserError, match=r"unknown key 'train.per_device_train_batch_size' \(did you mean "
                                        r"train.batch_size\? "):
        load_config(str(path))


def test_the_configuration_page_holds_the_table():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for entry in TRAINER_NAMES:
        assert f"| {entry.name} | {f'`{entry.setting}`' if entry.setting else '*none*'} |" in page, entry.name
