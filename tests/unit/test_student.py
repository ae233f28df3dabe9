"""The student built from its teacher (`model=from_teacher:N` + model_config width keys): the
teacher's layers copied at its width, weight selection when narrower (heads kept whole), the widths
that cannot be sliced refused, and what it costs against the teacher."""
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline import names
from pipeline.errors import UserError
from pipeline.kd import student
from pipeline.measure.flops import model_size
from pipeline.tasks import get_task

TASK = get_task("sentiment")
LAYER = "bert.encoder.layer.{}."


@pytest.fixture(scope="module")
def teacher():
    """6 layers, width 16, 4 heads of 4, feed-forward 32, 3 labels."""
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=6,
                                                    num_attention_heads=4, intermediate_size=32, num_labels=3))


def test_at_the_teachers_width_the_embeddings_head_and_evenly_spaced_layers_are_copied(teacher):
    made = student.from_teacher("from_teacher:3", teacher, TASK, {})
    assert made.config.num_hidden_layers == 3
    t, s = teacher.state_dict(), made.state_dict()
    assert set(s) <= set(t)
    for j, i in enumerate([0, 2, 4]):  # every other layer, as DistilBERT
        for key in s:
            if key.startswith(LAYER.format(j)):
                assert torch.equal(s[key], t[key.replace(LAYER.format(j), LAYER.format(i))]), key
    for key in ("bert.embeddings.word_embeddings.weight", "classifier.weight", "bert.pooler.dense.weight"):
        assert torch.equal(s[key], t[key])
    assert student.init_of("from_teacher:3", made.config, teacher.config) == student.TEACHER_LAYERS


def test_a_width_override_equal_to_the_teachers_builds_the_layer_copy(teacher):
    copied = student.from_teacher("from_teacher:2", teacher, TASK, {}).state_dict()
    same = student.from_teacher("from_teacher:2", teacher, TASK, {"hidden_size": 16, "num_attention_heads": 4,
                                                                  "intermediate_size": 32}).state_dict()
    assert copied.keys() == same.keys() and all(torch.equal(copied[k], same[k]) for k in copied)


def test_a_narrower_student_takes_the_teachers_slices_with_whole_heads(teacher):
    made = student.from_teacher("from_teacher:2", teacher, TASK, {"hidden_size": 8, "num_attention_heads": 2,
                                                                  "intermediate_size": 8})
    assert (made.config.hidden_size, made.config.num_attention_heads, made.config.intermediate_size) == (8, 2, 8)
    t, s = teacher.state_dict(), made.state_dict()
    hidden, ffn = [0, 2, 4, 6, 8, 10, 12, 14], [0, 4, 8, 12, 16, 20, 24, 28]
    heads = [0, 1, 2, 3, 8, 9, 10, 11]  # the teacher's heads 0 and 2 (of 4 dims each), whole
    layer1, teacher3 = LAYER.format(1), LAYER.format(3)  # student layer 1 is the teacher's layer 3
    q = t[teacher3 + "attention.self.query.weight"]
    assert torch.equal(s[layer1 + "attention.self.query.weight"], q[heads][:, hidden])
    assert torch.equal(s[layer1 + "attention.self.value.bias"], t[teacher3 + "attention.self.value.bias"][heads])
    assert torch.equal(s[layer1 + "attention.output.dense.weight"],
                       t[teacher3 + "attention.output.dense.weight"][hidden][:, heads])
    assert torch.equal(s[layer1 + "intermediate.dense.weight"],
                       t[teacher3 + "intermediate.dense.weight"][ffn][:, hidden])
    assert torch.equal(s[layer1 + "output.dense.weight"], t[teacher3 + "output.dense.weight"][hidden][:, ffn])
    assert torch.equal(s[layer1 + "output.LayerNorm.weight"], t[teacher3 + "output.LayerNorm.weight"][hidden])
    for key in ("bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                "bert.embeddings.token_type_embeddings.weight", "classifier.weight"):
        assert torch.equal(s[key], t[key][:, hidden]), key
    assert torch.equal(s["bert.embeddings.LayerNorm.bias"], t["bert.embeddings.LayerNorm.bias"][hidden])
    assert torch.equal(s["bert.pooler.dense.weight"], t["bert.pooler.dense.weight"][hidden][:, hidden])
    assert torch.equal(s["classifier.bias"], t["classifier.bias"])
    assert student.init_of("from_teacher:2", made.config, teacher.config) == student.WEIGHT_SELECTION
    made(input_ids=torch.tensor([[2, 7, 9, 3]])).logits.sum().backward()  # it runs and trains


def test_narrower_heads_keep_each_heads_first_dimensions(teacher):
    made = student.from_teacher("from_teacher:1", teacher, TASK, {"hidden_size": 8, "num_attention_heads": 4})
    t, s = teacher.state_dict(), made.state_dict()
    heads = [0, 1, 4, 5, 8, 9, 12, 13]  # all 4 heads, 2 of their 4 dimensions each
    assert torch.equal(s[LAYER.format(0) + "attention.self.key.weight"],
                       t[LAYER.format(0) + "attention.self.key.weight"][heads][:, [0, 2, 4, 6, 8, 10, 12, 14]])


def test_unset_heads_keep_the_teachers_head_size_and_the_feed_forward_its_ratio(teacher):
    made = student.from_teacher("from_teacher:1", teacher, TASK, {"hidden_size": 8})
    assert (made.config.num_attention_heads, made.config.intermediate_size) == (2, 16)  # heads of 4, ratio 2
    made = student.from_teacher("from_teacher:1", teacher, TASK, {"hidden_size": 12, "intermediate_size": 20})
    assert (made.config.num_attention_heads, made.config.intermediate_size) == (3, 20)


def test_electra_embeddings_at_the_teachers_width_narrow_with_it():
    from transformers import ElectraConfig, ElectraForSequenceClassification

    config = ElectraConfig(vocab_size=50, embedding_size=16, hidden_size=16, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=32, num_labels=3)
    teacher = ElectraForSequenceClassification(config)
    made = student.from_teacher("from_teacher:1", teacher, TASK, {"hidden_size": 8})
    assert made.config.embedding_size == 8 and not hasattr(made.electra, "embeddings_project")
    made(input_ids=torch.tensor([[2, 7, 9, 3]])).logits.sum().backward()


@pytest.mark.parametrize("hidden, projected", [(12, True), (8, False)])
def test_electra_embeddings_narrower_than_the_hidden_size_keep_their_width(hidden, projected):
    """The teacher's embeddings (8) are projected to its hidden size (16): the student keeps them
    whole; its projection is the teacher's sliced to its own width, or gone where the widths meet."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    config = ElectraConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=32, num_labels=3)
    teacher = ElectraForSequenceClassification(config)
    made = student.from_teacher("from_teacher:1", teacher, TASK, {"hidden_size": hidden})
    assert made.config.embedding_size == 8 and hasattr(made.electra, "embeddings_project") == projected
    words = made.electra.embeddings.word_embeddings.weight
    assert torch.equal(words, teacher.electra.embeddings.word_embeddings.weight)
    if projected:
        rows = student.spaced_layers(hidden, 16)
        assert torch.equal(made.electra.embeddings_project.weight, teacher.electra.embeddings_project.weight[rows])
    made(input_ids=torch.tensor([[2, 7, 9, 3]])).logits.sum().backward()


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 32}, "model_config.hidden_size=32: model=from_teacher:2 takes at least 1 and at most the "
                          "teacher's 16"),
    ({"intermediate_size": 64}, "model_config.intermediate_size=64"),
    ({"num_attention_heads": 8}, "model_config.num_attention_heads=8"),
    ({"hidden_size": 12, "num_attention_heads": 8}, "num_attention_heads=8"),
    ({"hidden_size": 10, "num_attention_heads": 4}, "model_config.num_attention_heads=4: must divide the hidden "
                                                    "size 10; would fit: model_config.hidden_size 4, 8, 12, 16"),
    ({"hidden_size": 8, "num_attention_heads": 1}, "heads of 8 dimensions (hidden_size 8 / 1) are wider than the "
                                                   "teacher's (4); would fit: model_config.num_attention_heads 2, 4 "
                                                   "or model_config.hidden_size 1, 2, 3, 4"),
    # heads unset: the key given is named, never the heads it implied
    ({"hidden_size": 10}, "config: model_config.hidden_size=10: with model_config.num_attention_heads unset the "
                          "student keeps the teacher's head size 4, which must split it; would fit: "
                          "model_config.hidden_size 4, 8, 12, 16"),
    ({"hidden_size": 6}, "config: model_config.hidden_size=6: with model_config.num_attention_heads unset the "
                         "student keeps the teacher's head size 4, which must split it; would fit: "
                         "model_config.hidden_size 4, 8, 12, 16 or model_config.num_attention_heads 2, 3"),
])
def test_a_width_that_cannot_be_sliced_from_the_teacher_is_refused(teacher, overrides, message):
    with pytest.raises(UserError, match="^config: ") as e:
        student.from_teacher("from_teacher:2", teacher, TASK, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_depth_comes_from_the_spec_and_width_keys_never_reach_the_teacher(teacher):
    with pytest.raises(UserError, match="the teacher has 6 layers"):
        student.from_teacher("from_teacher:7", teacher, TASK, {})
    with pytest.raises(UserError, match="expected from_teacher:N"):
        student.from_teacher("from_teacher:x", teacher, TASK, {})
    overrides = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 8, "hidden_dropout_prob": 0.0}
    assert student.teacher_overrides("from_teacher:2", overrides) == {"hidden_dropout_prob": 0.0}
    assert student.teacher_overrides(None, overrides) == {"hidden_dropout_prob": 0.0}  # the default student
    assert student.teacher_overrides("preset:bangla-tiny", overrides) == overrides
    with pytest.raises(UserError, match="model_config.num_hidden_layers: a from_teacher student's depth is N"):
        student.teacher_overrides("from_teacher:2", {"num_hidden_layers": 2})


def test_parameters_and_forward_flops_match_a_hand_count():
    config = BertConfig(vocab_size=100, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=32, type_vocab_size=2, num_labels=2)
    before = config.to_dict()
    size = model_size(TASK.model_class, config, 10)
    embeddings = 100 * 8 + 32 * 8 + 2 * 8  # word, position, token type tables
    layer = 3 * (8 * 8 + 8) + (8 * 8 + 8) + 2 * 8 + (8 * 16 + 16) + (16 * 8 + 8) + 2 * 8
    rest = 2 * 8 + (8 * 8 + 8) + (8 * 2 + 2)  # embedding LayerNorm, pooler, classifier
    assert size.params == embeddings + 2 * layer + rest == 2378
    assert size.params_non_embedding == 2 * layer + rest == 1306
    # matmuls 2 FLOPs per multiply-add: per layer the four projections and the feed-forward per
    # token, QK^T and attention x V per token pair; the pooler and classifier on the [CLS] row
    per_layer = 2 * 10 * (4 * 8 * 8 + 2 * 8 * 16) + 2 * 2 * 10 * 10 * 8
    assert size.forward_flops == 2 * per_layer + 2 * (8 * 8 + 8 * 2)
    assert config.to_dict() == before


def test_the_ratios_are_the_students_over_the_teachers(teacher):
    made = student.from_teacher("from_teacher:2", teacher, TASK, {"hidden_size": 8, "num_attention_heads": 2,
                                                                  "intermediate_size": 8})
    s, t = model_size(TASK.model_class, made.config, 16), model_size(TASK.model_class, teacher.config, 16)
    assert s.params == made.num_parameters() and t.params == teacher.num_parameters()
    ratios = student.ratios(s, t)
    assert ratios[names.KD_PARAM_RATIO_NON_EMBEDDING] == pytest.approx(
        made.num_parameters(exclude_embeddings=True) / teacher.num_parameters(exclude_embeddings=True))
    assert ratios[names.KD_PARAM_RATIO_NON_EMBEDDING] < 0.25 and 0 < ratios[names.KD_FLOPS_RATIO] < 1


def test_a_model_that_cannot_run_on_the_meta_device_has_its_parameters_counted_and_no_flops():
    from transformers import DebertaV2Config

    config = DebertaV2Config(vocab_size=100, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=16, num_labels=2)
    size = model_size(TASK.model_class, config, 10)
    assert size.forward_flops is None and size.params > size.params_non_embedding > 0
    assert names.MODEL_FORWARD_FLOPS not in size.figures()
    assert names.KD_FLOPS_RATIO not in student.ratios(size, size)
