"""Two runs' prediction files compared (report/agreement.py, report/reliability.py): agreement, the
flip table, McNemar's exact test, calibration, NER's per-type F1 with its interval, QA's HasAns/NoAns
flips and the headline, each against values worked out by hand in the comments."""
import json
import math

import pytest
from seqeval.metrics import classification_report

from pipeline.report.agreement import RARE_BELOW, compare, headline
from pipeline.report.reliability import plot_reliability

LABELS = ["neg", "neu", "pos"]


def head(task, n, labels=LABELS, precision="fp32", seed=1, model="m", data="fp1", split="test"):
    return {"format": "pipeline.predictions/1", "task": task, "split": split, "rows": n, "labels": labels,
            "data": data, "model": model, "precision": precision, "seed": seed}


def cls_rows(golds, preds, probs=None):
    """Classification rows; probs default to 0.8 on the prediction, 0.1 on the others."""
    probs = probs or [[0.8 if label == p else 0.1 for label in LABELS] for p in preds]
    return [{"id": f"r{i}", "gold": g, "pred": p, "probs": q} for i, (g, p, q) in enumerate(zip(golds, preds, probs))]


def cls_file(golds, preds, probs=None, **kw):
    return head("sentiment", len(golds), **kw), cls_rows(golds, preds, probs)


# 10 rows: r0-r3 both right; r4, r5 gold neu, both said pos (same wrong answer); r6-r8 gold neg and
# r9 gold pos, A right and B wrong. Agreement 6/10; only A right on 4, only B on 0.
GOLD = ["pos", "pos", "neg", "neg", "neu", "neu", "neg", "neg", "neg", "pos"]
PRED_A = ["pos", "pos", "neg", "neg", "pos", "pos", "neg", "neg", "neg", "pos"]
PRED_B = ["pos", "pos", "neg", "neg", "pos", "pos", "pos", "pos", "pos", "neg"]


def test_an_identical_pair_agrees_everywhere_with_p_one_and_equal_calibration():
    a = cls_file(GOLD, PRED_A)
    c = compare(a, cls_file(GOLD, PRED_A, precision="fp16"))
    assert (c.agreement, c.units, c.agreed, c.compared) == (100.0, 10, 10, 10)
    assert (c.total.only_a, c.total.only_b, c.total.both, c.total.neither) == (0, 0, 8, 2)
    assert c.mcnemar.p == 1.0 and c.losing == [] and c.gaining == []
    assert c.calibration["a"].ece == c.calibration["b"].ece
    assert c.calibration["a"].brier == c.calibration["b"].brier
    assert headline(c) == ("fp16 changed 0.0% of test predictions against FP32; McNemar p = 1 "
                           "(only FP32 right on 0, only fp16 on 0); no seed pair to judge the noise by")


def test_an_asymmetric_pair_against_hand_computed_counts_and_p():
    c = compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_B, precision="fp16"))
    assert c.agreement == pytest.approx(60.0)
    # binomtest(0, 4, 0.5), two-sided: 2 x 0.5^4 = 0.125
    assert (c.mcnemar.only_a, c.mcnemar.only_b) == (4, 0) and c.mcnemar.p == pytest.approx(0.125)
    # per gold class: pos r0 r1 both, r9 only A; neg r2 r3 both, r6-r8 only A; neu r4 r5 neither
    flips = {k: (f.both, f.only_a, f.only_b, f.neither, f.net) for k, f in c.flips.items()}
    assert flips == {"neg": (2, 3, 0, 0, -3), "neu": (0, 0, 0, 2, 0), "pos": (2, 1, 0, 0, -1)}
    assert c.losing == ["neg", "pos"] and c.gaining == []
    assert c.disagreed_a_right == 4
    json.loads(c.to_json())  # serialisable, no NaN


def test_the_headline_judges_against_the_seed_noise_and_has_a_kd_form():
    noise = compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_A, seed=2))  # the seeds differ on 0%
    c = compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_B, precision="fp16"))
    # 40% > 0% but p = 0.125 >= 0.05: within
    assert headline(c, noise) == ("fp16 changed 40.0% of test predictions against FP32 (two FP32 seeds differ on "
                                  "0.0%); McNemar p = 0.12: within the seed noise")
    # twice the rows: only A right on 8 of 20; binomtest(0, 8) = 2 x 0.5^8 = 0.0078 < 0.05: beyond
    big_a, big_b = cls_file(GOLD * 2, PRED_A * 2), cls_file(GOLD * 2, PRED_B * 2, precision="bf16")
    for rows in (big_a[1], big_b[1]):
        for i, r in enumerate(rows):
            r["id"] = f"r{i}"
    noise2 = compare(big_a, cls_file(GOLD * 2, PRED_A * 2, seed=2))
    assert headline(compare(big_a, big_b), noise2).endswith(
        "McNemar p = 0.0078: beyond the seed noise, bf16 right on 8 fewer rows than FP32")
    student = compare(cls_file(GOLD, PRED_A, model="teacher"), cls_file(GOLD, PRED_B, model="student"))
    # 4 rows disagree (r6-r9), A right on all 4
    assert headline(student) == ("the student disagrees with its teacher on 40.0% of test rows, of which 100% the "
                                 "teacher had right; McNemar p = 0.12 (only the teacher right on 4, only the student "
                                 "on 0); no seed pair to judge the noise by")
    twin = compare(cls_file(GOLD, PRED_A, model="teacher"), cls_file(GOLD, PRED_A, model="student"))
    assert headline(twin).startswith("the student agrees with its teacher on every test row;")
    with pytest.raises(ValueError, match="noise pair"):
        headline(c, compare(cls_file(GOLD, PRED_A, data="fp2"), cls_file(GOLD, PRED_A, data="fp2", seed=2)))


def test_a_student_that_leans_beyond_chance_within_a_reseeds_churn_is_said_so_by_its_roles():
    """Against the baseline, 8 of 20 rows flip to the student's favour (binomtest(8, 8) = 0.0078) while
    two seeds of the baseline differ on 8 rows too: no more churn than a reseed, but a lean."""
    gold = GOLD * 2
    baseline = cls_file(gold, PRED_B * 2, model="baseline")
    student = cls_file(gold, PRED_A * 2, model="student")
    reseeded = cls_file(gold, PRED_A * 2, model="baseline", seed=2)
    text = headline(compare(baseline, student), compare(baseline, reseeded), "the baseline `b`", "the student `s`")
    assert text == ("the student `s` disagrees with the baseline `b` on 40.0% of test rows, of which 0% the baseline "
                    "`b` had right (two seeds of the baseline `b` differ on 40.0%); McNemar p = 0.0078: no more "
                    "change than a reseed makes, but it leans to the student `s` (only the student `s` right on 8, "
                    "only the baseline `b` on 0)")


def test_ece_and_brier_on_a_hand_made_case():
    golds, preds = ["pos", "neg", "neg", "pos"], ["pos", "pos", "neg", "neg"]
    probs = [[0.1, 0.0, 0.9], [0.15, 0.0, 0.85], [0.7, 0.0, 0.3], [0.6, 0.0, 0.4]]
    c = compare(cls_file(golds, preds, probs), cls_file(golds, preds, probs, seed=2))
    cal = c.calibration["a"]
    # confidences .9 (right) and .85 (wrong) share the bin (0.8, 0.9]: accuracy .5, confidence .875;
    # .7 (right) in (0.6, 0.7], .6 (wrong) in (0.5, 0.6]:
    # ECE = 2/4 x |.5 - .875| + 1/4 x |1 - .7| + 1/4 x |0 - .6| = .1875 + .075 + .15 = .4125
    assert cal.ece == pytest.approx(0.4125)
    assert [(b.lo, b.count) for b in cal.bins] == [(pytest.approx(0.5), 1), (pytest.approx(0.6), 1),
                                                   (pytest.approx(0.8), 2)]
    # Brier, summed over classes: r0 .1^2 + .1^2 = .02; r1 .15 vs 1: .85^2 + .85^2 = 1.445;
    # r2 .3^2 + .3^2 = .18; r3 .6^2 + .6^2 = .72; mean 2.365 / 4 = .59125
    assert cal.brier == pytest.approx(0.59125)


def test_wikiqa_is_calibrated_on_its_binary_score():
    golds, scores = [1, 0, 0, 0], [0.9, 0.8, 0.3, 0.1]
    rows = [{"id": f"q1:{k}", "question": "q1", "score": s, "pred": int(s > 0.5), "gold": g}
            for k, (g, s) in enumerate(zip(golds, scores))]
    a = head("wikiqa", 4, labels=["0", "1"]), rows
    c = compare(a, a)
    # four bins of one row each: (|1 - .9| + |0 - .8| + |0 - .3| + |0 - .1|) / 4 = .325;
    # Brier (.1^2 + .8^2 + .3^2 + .1^2) / 4 = .1875
    assert c.calibration["a"].kind == "binary"
    assert c.calibration["a"].ece == pytest.approx(0.325) and c.calibration["a"].brier == pytest.approx(0.1875)
    # gold 0: r1 (pred 1) wrong on both sides, r2 r3 right; gold 1: r0 right
    assert {k: (f.both, f.neither) for k, f in c.flips.items()} == {"0": (2, 1), "1": (1, 0)}


def ner_row(i, gold, pred):
    from seqeval.metrics.sequence_labeling import get_entities

    return {"id": f"s{i}", "gold": gold, "pred": pred, "entities": [list(e) for e in get_entities(pred)]}


def test_ner_per_type_f1_by_hand_and_the_rare_type_marked():
    per, none = ["B-PER", "I-PER", "O"], ["O", "O", "O"]
    rows_a, rows_b = [], []
    for i in range(RARE_BELOW):  # PER: 30 gold; A finds all, B misses the first 3
        rows_a.append(ner_row(i, per, per if i else ["B-PER", "I-PER", "B-LOC"]))  # A: a false LOC in s0
        rows_b.append(ner_row(i, per, none if i < 3 else per))
    # LOC: gold in s30 and s31; A finds s30 only, B both
    rows_a += [ner_row(30, ["B-LOC", "O"], ["B-LOC", "O"]), ner_row(31, ["B-LOC", "O"], ["O", "O"])]
    rows_b += [ner_row(30, ["B-LOC", "O"], ["B-LOC", "O"]), ner_row(31, ["B-LOC", "O"], ["B-LOC", "O"])]
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    c = compare((head("ner", 32, labels=tags), rows_a), (head("ner", 32, labels=tags, precision="fp16"), rows_b))
    f1 = {t.type: t for t in c.entity_f1}
    # PER: A 30/30 -> 1; B TP 27, 27 predicted, 30 gold: 2 x 27 / 57 = .947
    # LOC: A TP 1, 2 predicted (s0's false one, s30), 2 gold: 2 x 1 / 4 = .5; B 2/2: 1
    assert f1["PER"].a.value == pytest.approx(1.0) and f1["PER"].b.value == pytest.approx(54 / 57)
    assert f1["LOC"].a.value == pytest.approx(0.5) and f1["LOC"].b.value == pytest.approx(1.0)
    assert (f1["PER"].gold, f1["PER"].rare, f1["LOC"].gold, f1["LOC"].rare) == (30, False, 2, True)
    for side, rows in (("a", rows_a), ("b", rows_b)):  # the same numbers as seqeval's report of the tags
        report = classification_report([r["gold"] for r in rows], [r["pred"] for r in rows], output_dict=True)
        assert {t: getattr(f1[t], side).value for t in f1} == pytest.approx({t: report[t]["f1-score"] for t in f1})
    # A is right on every PER sentence in every resample; B never beats it there, and matches it in
    # the resamples without B's 3 misses ((29/32)^32 = 4.4% of them, over the 2.5% tail): B's high is 1
    assert (f1["PER"].a.low, f1["PER"].a.high) == (1.0, 1.0)
    assert f1["PER"].b.low < 54 / 57 < f1["PER"].b.high == 1.0
    assert f1["PER"].diff.low < f1["PER"].diff.value < f1["PER"].diff.high == 0.0
    # agreement over the union of predicted entities: 30 PER (B shares 27) + LOC s0, s30, s31 (shared: s30)
    assert (c.units, c.agreed) == (33, 28)
    # words: 30 x 3 + 2 x 2 = 94; differing: B's 3 missed PER (2 words each), s0's false LOC, s31
    assert c.token_agreement == pytest.approx(100 * 86 / 94)
    # flips over gold | A | B: PER 27 both, 3 only A; LOC s30 both, s31 and s0's false one only B
    assert {k: (f.both, f.only_a, f.only_b) for k, f in c.flips.items()} == {"LOC": (1, 0, 2), "PER": (27, 3, 0)}
    assert c.losing == ["PER"] and c.gaining == ["LOC"]
    # binomtest(2, 5): symmetric, the two tails cover everything
    assert c.mcnemar.p == pytest.approx(1.0)
    assert headline(c).startswith("fp16 changed 15.2% of test predicted entities against FP32")


def test_qa_has_ans_and_no_ans_flips():
    golds = [["ঢাকা"], ["রবীন্দ্রনাথ"], [], [], ["1905"]]
    pred_a = ["ঢাকা", "রবীন্দ্রনাথ", "", "কলকাতা", ""]
    pred_b = ["ঢাকা।", "", "", "", "1905"]  # the danda goes in SQuAD's normalisation: q0 agrees

    def file(preds, precision):
        return head("qa", 5, labels=[], precision=precision), [
            {"id": f"q{i}", "pred": p, "score": 1.0, "null_score": 0.0, "gold": g, "has_answer": bool(g)}
            for i, (p, g) in enumerate(zip(preds, golds))]

    c = compare(file(pred_a, "fp32"), file(pred_b, "bf16"))
    # HasAns: q0 both right, q1 only A, q4 only B; NoAns: q2 both, q3 only B (A answered an unanswerable one)
    assert {k: (f.both, f.only_a, f.only_b, f.neither) for k, f in c.flips.items()} == {
        "HasAns": (1, 1, 1, 0), "NoAns": (1, 0, 1, 0)}
    assert c.agreement == pytest.approx(40.0)  # q0, q2
    assert c.null_flips == {"a_answered_b_null": 2, "a_null_b_answered": 1}  # q1, q3; q4
    assert c.gaining == ["NoAns"] and c.losing == []
    assert c.calibration is None


def test_mismatched_fingerprints_are_refused_and_unmatched_rows_counted():
    with pytest.raises(ValueError, match=r"A \(m, fp32, seed 1\) and B \(m, fp16, seed 1\) differ in their "
                                         r"data fingerprints \('fp1' vs 'fp2'\)"):
        compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_A, precision="fp16", data="fp2"))
    with pytest.raises(ValueError, match="splits"):
        compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_A, split="dev"))
    h, rows = cls_file(GOLD, PRED_A)
    c = compare((h, rows), (dict(h, rows=9), rows[1:]))
    assert (c.compared, c.only_in_a, c.only_in_b, c.units) == (9, 1, 0, 9)


def test_the_reliability_diagram_is_written(tmp_path):
    c = compare(cls_file(GOLD, PRED_A), cls_file(GOLD, PRED_B, precision="fp16"))
    assert plot_reliability({"fp32": c.calibration["a"], "fp16": c.calibration["b"]}, tmp_path) == ["reliability.png"]
    data = (tmp_path / "reliability.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    assert plot_reliability({"fp32": None}, tmp_path, "none.png") == [] and not (tmp_path / "none.png").exists()
    assert not math.isnan(c.calibration["b"].ece)


def test_one_sentence_has_no_interval_and_serialises_it_as_null():
    tags = ["O", "B-PER", "I-PER"]
    row = ner_row(0, ["B-PER", "O"], ["B-PER", "O"])
    c = compare((head("ner", 1, labels=tags), [row]), (head("ner", 1, labels=tags, seed=2), [row]))
    (per,) = c.to_dict()["entity_f1"]
    assert per["a"] == {"value": 1.0, "low": None, "high": None} and per["rare"]
    assert json.loads(c.to_json())["agreement"] == 100.0
