"""Extractive QA (squad_bn / SQuAD v2): both file layouts, offsets kept through normalization,
one-line errors, windows, span post-processing, SQuAD v2 scores, and the job end to end."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import written_twice
from pipeline.errors import UserError
from pipeline.models import preset_tokenizer
from pipeline.tasks import get_task
from pipeline.tasks.qa import normalize_answer, squad_v2_scores
from pipeline.tasks.samples.qa import CITIES, FRUITS, JOBS

TASK = get_task("qa")
CONTEXT = "রহিম ঢাকা শহরে থাকেন। রহিম-এর বয়স ৪২ বছর।"


def row(**changes):
    base = {"id": "q1", "title": "রহিম", "context": CONTEXT, "question": "রহিম কোথায় থাকেন?",
            "answers": {"text": ["ঢাকা"], "answer_start": [5]}}
    return {**base, **changes}


def write_jsonl(tmp_path, rows, name="train.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def train():
    """The built-in sample set's training split, read once (normalizing it is most of its cost)."""
    return TASK.load(None, "train")


@pytest.fixture(scope="module")
def tokenizer(train):
    return preset_tokenizer(TASK.texts(train))


# ---------------------------------------------------------------------- reading


def test_reads_jsonl_and_keeps_answer_offsets_through_normalization(tmp_path):
    # double spaces collapse and NFKC turns the ligature "ﬁ" into two letters: every offset
    # after them moves, and the reader must move answer_start with them
    messy = "ﬁ  রহিম   ঢাকা  শহরে থাকেন। রহিম-এর বয়স ৪২ বছর।"
    start = messy.index("৪২")
    path = write_jsonl(tmp_path, [row(context=messy, question="  রহিম-এর  বয়স কত? ",
                                      answers={"text": ["৪২"], "answer_start": [start]}),
                                  row(id="q2", answers={"text": [], "answer_start": []})])
    first, second = TASK.load(str(path), "train")
    assert first["context"] == "fi রহিম ঢাকা শহরে থাকেন। রহিম-এর বয়স ৪২ বছর।"
    assert first["question"] == "রহিম-এর বয়স কত?"
    (s,) = first["answers"]["answer_start"]
    assert s != start and first["context"][s:s + 2] == "৪২" and first["answers"]["text"] == ["৪২"]
    assert second["answers"] == {"text": [], "answer_start": []}  # unanswerable questions are kept


def test_reads_the_nested_squad_v2_layout_like_the_jsonl_one(tmp_path):
    nested = {"version": "v2.0", "data": [{"title": "রহিম", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q1", "question": "রহিম কোথায় থাকেন?", "answers": [{"text": "ঢাকা", "answer_start": 5},
                                                                  {"text": "ঢাকা শহরে", "answer_start": 5}],
         "is_impossible": False},
        {"id": "q2", "question": "রহিম কী খান?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "ঢাকা", "answer_start": 5}]}]}]}]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(nested, ensure_ascii=False, indent=2), encoding="utf-8")
    flat = write_jsonl(tmp_path, [row(answers={"text": ["ঢাকা", "ঢাকা শহরে"], "answer_start": [5, 5]}),
                                  row(id="q2", question="রহিম কী খান?", answers={"text": [], "answer_start": []})])
    assert TASK.load(str(path), "dev") == TASK.load(str(flat), "dev")


def test_hub_rows_share_the_checks(tmp_path):
    import datasets

    rows = datasets.Dataset.from_list([row(), row(id="q2", question=" ")])
    with pytest.raises(UserError, match=r"^hub:x/squad_bn: row 2: empty question$"):
        TASK.from_hub_rows(rows, "hub:x/squad_bn")
    assert TASK.from_hub_rows(rows.select([0]), "hub:x/squad_bn")[0]["answers"]["text"] == ["ঢাকা"]


@pytest.mark.parametrize("lines, message", [
    ([row(), {"id": "q2", "context": CONTEXT}], "line 2: missing field(s) question, answers"),
    ([row(question="  ")], "line 1: empty question"),
    ([row(context="")], "line 1: empty context"),
    ([row(answers={"text": ["ঢাকা"], "answer_start": []})], "line 1: answers has 1 text(s) but 0 answer_start(s)"),
    ([row(answers={"text": ["ঢাকা"], "answer_start": [6]})],
     "line 1: answer_start 6 does not match the context: context[6:10] is 'াকা ', expected 'ঢাকা'"),
    ([row(answers={"text": ["ঢাকা"], "answer_start": ["5"]})], "line 1: answer_start '5' is not an offset"),
    ([row(answers={"text": [""], "answer_start": [0]})], "line 1: empty answer text"),
    ([row(answers=["ঢাকা"])], "line 1: answers must be an object with lists 'text' and 'answer_start'"),
    ([row(), "", '{"id": "q3", "context": '], "line 3: invalid JSON"),
    ([row(), "[1, 2]"], "line 2: expected a JSON object, got list"),
])
def test_bad_jsonl_names_file_line_and_reason(tmp_path, lines, message):
    path = write_jsonl(tmp_path, lines)
    with pytest.raises(UserError) as e:
        TASK.load(str(path), "train")
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


BAD_FILES = [  # (content, message) of a dev.json: tests/unit/test_task_bad_files.py
    (b"", "empty file"),
    (b"  \n\n", "empty file"),
    (json.dumps(row()).encode() + b'\n{"id": "\xff\xfe"}\n', "line 2: not UTF-8 text"),
    (b'{"data": [{"paragraphs": [{"context": "x"}]}]}', "data[0].paragraphs[0]: field qas missing or not a list"),
    (json.dumps({"data": [{"paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "a", "question": "?", "answers": [{"text": "ঢাকা", "answer_start": 9}]}]}]}]}).encode(),
     "data[0].paragraphs[0].qas[0]: answer_start 9 does not match the context"),
    (json.dumps({"data": []}).encode(), "no questions"),
    (b'{\n  "data": [\n    {"paragraphs": ]\n}', "line 3: invalid JSON"),  # a broken nested document
]


def test_unknown_or_bad_task_options_are_user_errors():
    with pytest.raises(UserError, match=r"^config: task_options.strid: unknown option for task qa"):
        get_task("qa", {"strid": 8})
    with pytest.raises(UserError, match=r"^config: task_options.n_best=0: must be an integer >= 1$"):
        get_task("qa", {"n_best": 0})


def test_sample_set_is_deterministic_with_unanswerable_questions_and_long_contexts(tmp_path, train, tokenizer):
    a = written_twice(TASK, tmp_path)
    assert a["train"].read_bytes() == Path(TASK.resolve_source(None, "train")).read_bytes()  # what `train` read
    examples = train
    unanswerable = sum(not e["answers"]["text"] for e in examples) / len(examples)
    assert 0.1 < unanswerable < 0.2
    features = TASK.featurize(examples, tokenizer, 64, "train")
    assert len(features) > len(examples) + 30  # some contexts need two or more windows


def test_most_answers_have_a_distractor_of_their_own_kind(train):
    """A city next to another city (where one lives, where one was born, where the friend lives),
    a number next to another number, a job next to the friend's: knowing what an answer looks
    like is not enough, the question's words must be matched (issue 16)."""
    kinds = [CITIES, JOBS, FRUITS]
    answered = [e for e in train if e["answers"]["text"]]
    with_distractor = 0
    for e in answered:
        gold = e["answers"]["text"][0]
        same_kind = next((k for k in kinds if gold in k), None)
        if same_kind is None:  # a number: another number in the paragraph
            others = [w for w in re.findall(r"[০-৯]+", e["context"]) if w != gold]
        else:
            others = [v for v in same_kind if v != gold and v in e["context"]]
        with_distractor += bool(others)
    assert with_distractor > 0.6 * len(answered)


# ---------------------------------------------------------------------- windows and post-processing

LONG = ("রহিম ঢাকা শহরে থাকেন। সেখানে প্রতি সপ্তাহে একটি বড় হাট বসে। শীতকালে এই এলাকায় অনেক কুয়াশা পড়ে। "
        "নদীর পাশে একটি পুরনো মসজিদ আছে। স্থানীয় বাজারে সবজি বেশ সস্তা। রহিম-এর বয়স ৪২ বছর।")
QA_OPTIONS = {"stride": 4}


def long_examples():
    return [{"id": "a", "title": "", "context": LONG, "question": "রহিম-এর বয়স কত?",
             "answers": {"text": ["৪২"], "answer_start": [LONG.index("৪২")]}},
            {"id": "b", "title": "", "context": CONTEXT, "question": "করিম কোথায় থাকেন?",
             "answers": {"text": [], "answer_start": []}}]


def test_an_answer_in_the_second_window_is_labelled_there_and_cls_in_the_first(tokenizer):
    task = get_task("qa", QA_OPTIONS)
    features = task.featurize(long_examples(), tokenizer, 32, "train")
    assert len(features) == 3  # two windows of the long context, one of the short
    first, second, short = features
    assert (first["start_positions"], first["end_positions"]) == (0, 0)
    s, e = second["start_positions"], second["end_positions"]
    assert 0 < s <= e and tokenizer.decode(second["input_ids"][s:e + 1]) == "৪২"
    assert (short["start_positions"], short["end_positions"]) == (0, 0)  # unanswerable: CLS
    assert features["idx"] == [0, 1, 2] and max(len(ids) for ids in features["input_ids"]) <= 32


def test_a_stride_that_leaves_no_room_is_a_user_error_and_long_questions_are_cut(tokenizer):
    with pytest.raises(UserError, match=r"^config: task_options.stride=24: must be < \d+, the context tokens"):
        get_task("qa", {"stride": 24}).featurize(long_examples(), tokenizer, 32, "train")
    long_question = dict(long_examples()[0], question=" ".join(["রহিম-এর বয়স কত?"] * 10))
    (first, *_) = get_task("qa").featurize([long_question], tokenizer, 32, "dev")
    assert first["token_type_ids"].count(0) <= 32 // 2 + 2  # the question is cut to half a window


def test_eval_features_keep_context_offsets_and_the_collator_drops_them(tokenizer):
    task = get_task("qa", QA_OPTIONS)
    features = task.featurize(long_examples(), tokenizer, 32, "dev")
    assert features["example_index"] == [0, 0, 1]
    for f in features:
        # offsets only on context tokens (type 1, not the final [SEP]); None elsewhere
        assert all(o is None for o, t in zip(f["offset_mapping"], f["token_type_ids"]) if t == 0)
        assert f["offset_mapping"][-1] is None and f["offset_mapping"][-2] is not None
    batch = task.collator(tokenizer)([features[i] for i in range(3)])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "idx"}


def logits_for(features, picks, width=32):
    """Zero logits with chosen (feature, start token, end token, value) raised."""
    start, end = np.zeros((len(features), width), np.float32), np.zeros((len(features), width), np.float32)
    for f, s, e, value in picks:
        start[f, s] += value
        end[f, e] += value
    return {"start_logits": start, "end_logits": end}


def test_post_processing_picks_the_best_span_over_windows_and_the_null_answer(tokenizer):
    task = get_task("qa", QA_OPTIONS)
    examples = long_examples()
    features = task.featurize(examples, tokenizer, 32, "dev")
    offsets = features[1]["offset_mapping"]
    answer = [i for i, o in enumerate(offsets) if o and LONG[o[0]:o[1]] == "৪২"][0]
    first_context = features[0]["offset_mapping"].index(next(o for o in features[0]["offset_mapping"] if o))
    short_context = features[2]["offset_mapping"].index(next(o for o in features[2]["offset_mapping"] if o))
    preds = logits_for(features, [
        (1, answer, answer, 5.0),        # the answer in window 2: score 10
        (0, first_context, first_context, 4.0),  # a weaker span in window 1: score 8
        (0, 0, 0, 6.0),                  # window 1 points at CLS (12), but the lowest null counts (0)
        (2, 0, 0, 3.0),                  # the short example: null 6 ...
        (2, short_context, short_context, 2.0),  # ... beats its best span, 4
        (1, answer + 1, answer, 9.0),    # end before start: never a span
    ])
    assert task.postprocess(preds, examples, features) == ["৪২", ""]
    assert task.metrics(preds, examples, features) == {
        "exact": 1.0, "f1": 1.0, "HasAns_exact": 1.0, "HasAns_f1": 1.0, "NoAns_exact": 1.0, "NoAns_f1": 1.0}
    assert task.tie_breakers == ("exact",)
    assert set(task.metrics(preds, examples, features)) == set(task.metric_names()) and not task.scores_loss
    # spans longer than max_answer_length (tokens) are not answers
    wide = logits_for(features, [(1, answer - 1, answer, 5.0), (1, 0, 0, -20.0)])
    two_tokens = LONG[offsets[answer - 1][0]:offsets[answer][1]]
    assert task.postprocess(wide, examples, features)[0] == two_tokens
    assert get_task("qa", {**QA_OPTIONS, "max_answer_length": 1}).postprocess(wide, examples, features)[0] != two_tokens


def test_a_prediction_row_holds_the_answer_given_and_both_scores_it_was_chosen_by(tokenizer):
    task = get_task("qa", QA_OPTIONS)
    examples = long_examples()
    features = task.featurize(examples, tokenizer, 32, "dev")
    answer = [i for i, o in enumerate(features[1]["offset_mapping"]) if o and LONG[o[0]:o[1]] == "৪২"][0]
    short_context = features[2]["offset_mapping"].index(next(o for o in features[2]["offset_mapping"] if o))
    preds = logits_for(features, [(1, answer, answer, 5.0), (2, 0, 0, 3.0), (2, short_context, short_context, 2.0)])
    assert task.prediction_rows(preds, examples, features) == [
        {"id": "a", "pred": "৪২", "score": 10.0, "null_score": 0.0, "gold": ["৪২"], "has_answer": True},
        {"id": "b", "pred": "", "score": 4.0, "null_score": 6.0, "gold": [], "has_answer": False}]
    assert task.prediction_labels() == []


def test_a_model_that_answers_no_question_is_stalled(tokenizer):
    """The null-answer plateau: "" for every question scores the unanswerable share of F1."""
    task = get_task("qa", QA_OPTIONS)
    examples = long_examples()  # one answerable question, one unanswerable
    features = task.featurize(examples, tokenizer, 32, "dev")
    answer = [i for i, o in enumerate(features[1]["offset_mapping"]) if o and LONG[o[0]:o[1]] == "৪২"][0]
    null_everywhere = logits_for(features, [(f, 0, 0, 3.0) for f in range(3)])
    assert task.stall(null_everywhere, examples, features) == "no question answered"
    # one answer given, even a wrong one, is a model that points at spans: not stalled
    assert task.stall(logits_for(features, [(1, answer, answer, 5.0)]), examples, features) is None
    # a split with no answerable question: "" everywhere is the right answer
    unanswerable = [examples[1]]
    only = task.featurize(unanswerable, tokenizer, 32, "dev")
    assert task.stall(logits_for(only, [(0, 0, 0, 3.0)]), unanswerable, only) is None


def test_predictions_have_a_fixed_width_whatever_the_batch(tokenizer):
    import torch
    from transformers.modeling_outputs import QuestionAnsweringModelOutput

    task = get_task("qa")
    task.featurize(long_examples(), tokenizer, 48, "dev")
    out = task.predictions(QuestionAnsweringModelOutput(start_logits=torch.ones(2, 20, dtype=torch.bfloat16),
                                                        end_logits=torch.ones(2, 20)), {})
    assert out["start_logits"].shape == (2, 48) and out["start_logits"].dtype == np.float32
    assert out["end_logits"][:, 20:].max() < -1e8 and out["end_logits"][:, :20].min() == 1


# ---------------------------------------------------------------------- SQuAD v2 scores


def test_the_training_loss_ignores_padding():
    """Start/end cross-entropy over the real tokens only: the same rows padded to another width
    (a longer window in the batch, another split across ranks) give the same loss; without
    padding it is the model's own loss, (CE(start) + CE(end)) / 2."""
    from types import SimpleNamespace

    import torch

    torch.manual_seed(0)
    start, end = torch.randn(2, 6), torch.randn(2, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    batch = {"attention_mask": mask, "start_positions": torch.tensor([2, 0]), "end_positions": torch.tensor([4, 3])}
    loss = TASK.loss(SimpleNamespace(start_logits=start, end_logits=end), batch)
    wider = {**batch, "attention_mask": torch.cat([mask, torch.zeros(2, 3, dtype=mask.dtype)], 1)}
    noise = torch.full((2, 3), 50.0)  # whatever the model says at padding
    outputs = SimpleNamespace(start_logits=torch.cat([start, noise], 1), end_logits=torch.cat([end, noise], 1))
    assert TASK.loss(outputs, wider).item() == pytest.approx(loss.item(), rel=1e-6)
    # row 1's padding was already left out: by hand, CE over its first four logits only
    ce = torch.nn.functional.cross_entropy
    by_hand = (ce(start[:1], batch["start_positions"][:1]) + ce(start[1:, :4], batch["start_positions"][1:])
               + ce(end[:1], batch["end_positions"][:1]) + ce(end[1:, :4], batch["end_positions"][1:])) / 4
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_answer_normalization_strips_bangla_and_ascii_punctuation():
    assert normalize_answer("ঢাকা।") == "ঢাকা"
    assert normalize_answer("  The  ঢাকা, শহর॥ ৺") == "ঢাকা শহর"
    assert normalize_answer("An Apple") == "apple"


def test_squad_v2_scores_against_hand_computed_values():
    preds = ["ঢাকা।", "ঢাকা শহর", "রাজশাহী", "", "ঢাকা", "১৯৯৫ সালে জন্ম"]
    golds = [["ঢাকা"],                         # exact after the danda is stripped: 1 / 1
             ["চট্টগ্রাম", "ঢাকা শহরে", "ঢাকা শহর"],  # max over golds: the third is exact: 1 / 1
             ["খুলনা"],                         # wrong: 0 / 0
             [],                                 # unanswerable, predicted "": 1 / 1
             [],                                 # unanswerable, answered: 0 / 0
             ["১৯৯৫ সালে"]]                    # partial: P 2/3, R 1 -> F1 0.8; exact 0
    m = squad_v2_scores(preds, golds)
    assert m["HasAns_exact"] == pytest.approx(2 / 4)
    assert m["HasAns_f1"] == pytest.approx((1 + 1 + 0 + 0.8) / 4)
    assert m["NoAns_exact"] == m["NoAns_f1"] == pytest.approx(1 / 2)
    assert m["exact"] == pytest.approx(3 / 6)
    assert m["f1"] == pytest.approx((1 + 1 + 0 + 1 + 0 + 0.8) / 6)
    # an empty prediction for an answerable question scores 0; a subset that is empty has no key
    only_has = squad_v2_scores(["", "ঢাকা"], [["ঢাকা"], ["ঢাকা"]])
    assert only_has == {"exact": 0.5, "f1": 0.5, "HasAns_exact": 0.5, "HasAns_f1": 0.5}
    assert set(squad_v2_scores([""], [[]])) == {"exact", "f1", "NoAns_exact", "NoAns_f1"}
