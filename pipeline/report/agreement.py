"""Two runs' predictions on one split compared row by row: how often they agree, who
was right where they differ, whether that leans one way beyond chance, how each is calibrated,
and one sentence a reader can act on.

Input: two parsed prediction files (header, rows), format pipeline.predictions/1, of one task,
split and data fingerprint (anything else is refused); A is the reference (FP32, the teacher),
B the compared run (AMP, the student). Only rows both predicted (matched by id) are compared;
the rows in one file only are counted.

The units, per task:
- classification (sentiment, error_cls) and WikiQA: a row; it agrees when both predicted the same
  label, is right when its prediction is the gold label; the flip table is per gold label.
- NER: an entity (type, first word, last word) of a sentence. Agreement is over the union of
  both sides' predicted entities (an entity agrees when both predicted it); the flip table is
  over every entity gold, A or B has, per its type, a side right about it when it predicted it
  exactly if it is gold. Gold's entities are what seqeval's default (conlleval-compatible) reading
  finds in the gold tags, as the task scores itself; a side's are its file's. Also the words' tag
  agreement, and each type's F1 on each side with a bootstrap interval (entity_f1).
- QA: a question; two answers agree when SQuAD's normalisation (pipeline/tasks/qa.py) makes them
  equal, an answer is right by the official SQuAD v2 exact match; the flip table is per
  HasAns/NoAns, with the questions one side answered and the other left unanswered.

McNemar's exact test: scipy's two-sided binomial test on the units exactly one side got right
(p = 1 without any). Calibration (reliability.py): where the rows carry probabilities.

The bootstrap: sentences are resampled (scipy.stats.bootstrap, paired=True: one set of resampled
sentences for both sides and the gold, so each type's F1 on A, on B and their difference come
from the same draws; percentile intervals, BOOTSTRAP_RESAMPLES resamples, seed BOOTSTRAP_SEED).

A rare entity type has fewer than RARE_BELOW gold entities: one entity found or missed moves
its recall by more than 3 points, so its F1 and interval say little.

The headline's rule (`headline`): B's change is beyond the seed noise when it changes more units
than the noise pair (two seeds of A's setup) differ on AND McNemar's p < ALPHA: more churn than
a reseed and leaning one way beyond chance. Either alone is not enough: a reseed can churn as
much, and churn whose flips cancel changes no score.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.report import reliability
from pipeline.report.reliability import Calibration

FORMAT = "pipeline.predictions/1"
CLASSIFICATION = ("sentiment", "error_cls")
TASKS = (*CLASSIFICATION, "ner", "qa", "wikiqa")
ALPHA = 0.05
RARE_BELOW = 30
BOOTSTRAP_RESAMPLES = 500
"""About 0.3 s of CPU for 3,000 sentences x 7 types (1,000: twice that); enough for a 95% interval's ends."""
BOOTSTRAP_SEED = 0
UNITS = {"ner": "entities", "qa": "questions"}
"""What one compared unit is called; "rows" otherwise."""
SINGULAR = {"rows": "row", "predicted entities": "predicted entity", "questions": "question"}


@dataclass
class Flips:
    """Per class: how many units both sides got right, only A, only B, neither; net = only_b - only_a."""
    both: int = 0
    only_a: int = 0
    only_b: int = 0
    neither: int = 0
    net: int = 0

    def add(self, a_right: bool, b_right: bool) -> None:
        if a_right and b_right:
            self.both += 1
        elif a_right:
            self.only_a += 1
        elif b_right:
            self.only_b += 1
        else:
            self.neither += 1
        self.net = self.only_b - self.only_a


@dataclass
class McNemar:
    only_a: int
    only_b: int
    p: float
    """Exact two-sided binomial test of only_b out of only_a + only_b against 1/2; 1.0 with none."""


@dataclass
class Estimate:
    value: float
    low: float
    high: float
    """The bootstrap's 95% percentile interval; NaN (None in to_dict) with fewer than 2 sentences."""


@dataclass
class TypeF1:
    type: str
    gold: int
    """Gold entities of the type in the compared sentences."""
    rare: bool
    a: Estimate
    b: Estimate
    diff: Estimate
    """B's F1 - A's, its interval from the same resampled sentences."""


@dataclass
class PairComparison:
    task: str
    split: str
    data: str
    a: dict
    """A's run as its header names it: model, precision, seed."""
    b: dict
    compared: int
    """Rows (sentences, questions) both files hold."""
    only_in_a: int
    only_in_b: int
    unit: str
    """rows, entities or questions: what agreement and the flip table count."""
    units: int
    """Units agreement is over (NER: the union of both sides' predicted entities)."""
    agreed: int
    agreement: float
    """% of units agreed on (100 where there are none)."""
    disagreed_a_right: int
    """Units the sides disagree on that A had right."""
    flips: dict[str, Flips]
    total: Flips
    losing: list[str]
    """Up to 3 classes where B lost most against A (net < 0), most first."""
    gaining: list[str]
    mcnemar: McNemar
    calibration: dict[str, Calibration] | None = None
    """{"a": ..., "b": ...} where the rows carry probabilities (classification, WikiQA)."""
    token_agreement: float | None = None
    """NER: % of words both tagged alike."""
    entity_f1: list[TypeF1] | None = None
    null_flips: dict[str, int] | None = None
    """QA: {"a_answered_b_null": n, "a_null_b_answered": n}."""

    def to_dict(self) -> dict:
        """JSON-serialisable (NaN as None)."""
        return _finite(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)


def compare(a: tuple[dict, list[dict]], b: tuple[dict, list[dict]]) -> PairComparison:
    """A and B's prediction files compared on the rows both hold (see the module docstring)."""
    (head_a, rows_a), (head_b, rows_b) = a, b
    _check_same(head_a, head_b)
    by_a, by_b = _by_id(rows_a, head_a, "A"), _by_id(rows_b, head_b, "B")
    pairs = [(row, by_b[i]) for i, row in by_a.items() if i in by_b]
    for ra, rb in pairs:  # one fingerprint should mean one gold; a file that breaks it is not trusted
        if ra["gold"] != rb["gold"]:
            raise ValueError(f"compare: row {ra['id']!r}: A ({_label(head_a)}) and B ({_label(head_b)}) "
                             f"give it different gold answers ({ra['gold']!r} vs {rb['gold']!r})")
    task = head_a["task"]
    found = {"ner": _ner, "qa": _qa}.get(task, _labelled)(pairs, head_a, head_b)
    agree, flips = found.pop("agree"), found.pop("flips")
    total = Flips(*(sum(getattr(f, name) for f in flips.values()) for name in ("both", "only_a", "only_b", "neither")))
    total.net = total.only_b - total.only_a
    ranked = sorted(flips, key=lambda k: flips[k].net)
    return PairComparison(
        task=task, split=head_a["split"], data=head_a["data"], a=_run(head_a), b=_run(head_b),
        compared=len(pairs), only_in_a=len(by_a) - len(pairs), only_in_b=len(by_b) - len(pairs),
        unit=UNITS.get(task, "rows"), units=len(agree), agreed=sum(same for same, _ in agree),
        agreement=100.0 * sum(same for same, _ in agree) / len(agree) if agree else 100.0,
        disagreed_a_right=sum(a_right for same, a_right in agree if not same),
        flips=flips, total=total, losing=[k for k in ranked if flips[k].net < 0][:3],
        gaining=[k for k in reversed(ranked) if flips[k].net > 0][:3], mcnemar=mcnemar(total), **found)


def mcnemar(flips: Flips) -> McNemar:
    """McNemar's exact test on the discordant units."""
    from scipy.stats import binomtest

    n = flips.only_a + flips.only_b
    p = binomtest(flips.only_b, n, 0.5).pvalue if n else 1.0
    return McNemar(flips.only_a, flips.only_b, float(p))


def headline(comparison: PairComparison, noise: PairComparison | None = None, reference: str | None = None,
             compared: str | None = None) -> str:
    """One sentence: how much B changed against A (the KD form where their models differ: B is
    the student), the noise pair's disagreement, McNemar's p and the verdict (the rule in the
    module docstring; a lean beyond chance within the noise's churn is said as such); without a
    noise pair, no verdict on the noise. `reference`, `compared`: the sides in words where the
    report knows their roles (its teacher, the baseline); else read from the headers."""
    c = comparison
    if noise is not None and (noise.task, noise.split, noise.data) != (c.task, c.split, c.data):
        raise ValueError(f"headline: the noise pair ({noise.task}, {noise.split}, data {noise.data}) is not "
                         f"on the compared pair's rows ({c.task}, {c.split}, data {c.data})")
    changed = 100.0 - c.agreement
    disagreed = c.units - c.agreed
    if c.a.get("model") != c.b.get("model"):
        name_a, name_b, with_a = reference or "the teacher", compared or "the student", reference or "its teacher"
        if not disagreed:
            text = f"{name_b} agrees with {with_a} on every {c.split} {SINGULAR[_noun(c, 'kd')]}"
        else:
            text = (f"{name_b} disagrees with {with_a} on {changed:.1f}% of {c.split} {_noun(c, 'kd')}, "
                    f"of which {100.0 * c.disagreed_a_right / disagreed:.0f}% {name_a} had right")
    else:
        name_a, name_b = reference or _label(c.a, c.b), compared or _label(c.b, c.a)
        text = f"{name_b} changed {changed:.1f}% of {c.split} {_noun(c, 'amp')} against {name_a}"
    m = c.mcnemar
    if noise is not None:
        seeds = f"two seeds of {name_a}" if reference else _noise_words(noise)
        text += f" ({seeds} differ on {100.0 - noise.agreement:.1f}%)"
    text += f"; McNemar p = {m.p:.2g}"
    if noise is None:
        return text + (f" (only {name_a} right on {m.only_a}, only {name_b} on {m.only_b}); "
                       "no seed pair to judge the noise by")
    if changed > 100.0 - noise.agreement and m.p < ALPHA:
        return text + (f": beyond the seed noise, {name_b} right on {abs(c.total.net)} "
                       f"{'more' if c.total.net > 0 else 'fewer'} {c.unit} than {name_a}")
    if m.p < ALPHA:  # no more churn than a reseed, but the flips lean one way beyond chance
        leans = name_b if m.only_b > m.only_a else name_a
        return text + (f": no more change than a reseed makes, but it leans to {leans} (only {name_b} right on "
                       f"{m.only_b}, only {name_a} on {m.only_a})")
    return text + ": within the seed noise"


# ------------------------------------------------------------------ per task: agreement and flip units

def _labelled(pairs: list[tuple[dict, dict]], head_a: dict, head_b: dict) -> dict:
    """Classification and WikiQA: a row per unit, flips per gold label; calibration from the
    probabilities (classification) or the score (WikiQA)."""
    wikiqa = head_a["task"] == "wikiqa"
    labels = [str(label) for label in head_a["labels"]]
    flips = {label: Flips() for label in labels}
    agree = []
    for ra, rb in pairs:
        gold = str(ra["gold"])
        right_a, right_b = str(ra["pred"]) == gold, str(rb["pred"]) == gold
        flips.setdefault(gold, Flips()).add(right_a, right_b)
        agree.append((str(ra["pred"]) == str(rb["pred"]), right_a))
    if not pairs:
        return {"agree": agree, "flips": flips}
    sides = {}
    for side, head, at in (("a", head_a, 0), ("b", head_b, 1)):
        rows = [p[at] for p in pairs]
        if wikiqa:
            sides[side] = reliability.binary([int(r["gold"]) for r in rows], [float(r["score"]) for r in rows])
        else:
            ids = {str(label): i for i, label in enumerate(head["labels"])}
            sides[side] = reliability.top_class([_id(ids, r["gold"], side) for r in rows],
                                                np.array([r["probs"] for r in rows], dtype=float),
                                                [_id(ids, r["pred"], side) for r in rows])
    return {"agree": agree, "flips": flips, "calibration": sides}


def _ner(pairs: list[tuple[dict, dict]], head_a: dict, head_b: dict) -> dict:
    """NER: entity units, the words' tag agreement and each type's F1 with its interval."""
    from seqeval.metrics.sequence_labeling import get_entities

    agree, flips, sentences = [], defaultdict(Flips), ([], [], [])
    words = same_words = 0
    for ra, rb in pairs:
        gold = set(get_entities(list(ra["gold"])))
        ents_a = {tuple(e) for e in ra["entities"]}
        ents_b = {tuple(e) for e in rb["entities"]}
        for e in sorted(gold | ents_a | ents_b):
            in_gold = e in gold
            flips[e[0]].add((e in ents_a) == in_gold, (e in ents_b) == in_gold)
        agree += [(e in ents_a and e in ents_b, (e in ents_a) == (e in gold)) for e in sorted(ents_a | ents_b)]
        for side, found in zip(sentences, (gold, ents_a, ents_b)):
            side.append(found)
        words += len(ra["gold"])
        same_words += sum(x == y for x, y in zip(ra["pred"], rb["pred"]))
    return {"agree": agree, "flips": dict(sorted(flips.items())),
            "token_agreement": 100.0 * same_words / words if words else 100.0, "entity_f1": entity_f1(*sentences)}


def _qa(pairs: list[tuple[dict, dict]], head_a: dict, head_b: dict) -> dict:
    """QA: a question per unit, flips per HasAns/NoAns, and the questions only one side answered."""
    # imported on use: qa.py brings torch and transformers, which no other task here needs
    from pipeline.tasks.qa import normalize_answer, squad_v2_scores

    flips = {"HasAns": Flips(), "NoAns": Flips()}
    agree, nulls = [], Counter(a_answered_b_null=0, a_null_b_answered=0)
    for ra, rb in pairs:
        right_a = squad_v2_scores([ra["pred"]], [ra["gold"]])["exact"] == 1.0
        right_b = squad_v2_scores([rb["pred"]], [ra["gold"]])["exact"] == 1.0
        flips["HasAns" if ra["has_answer"] else "NoAns"].add(right_a, right_b)
        norm_a, norm_b = normalize_answer(ra["pred"]), normalize_answer(rb["pred"])
        agree.append((norm_a == norm_b, right_a))
        if bool(norm_a) != bool(norm_b):
            nulls["a_answered_b_null" if norm_a else "a_null_b_answered"] += 1
    return {"agree": agree, "flips": flips, "null_flips": dict(nulls)}


# ------------------------------------------------------------------ NER: per-type F1 and its interval

def entity_f1(gold: list[set], a: list[set], b: list[set]) -> list[TypeF1]:
    """Per entity type (gold or predicted): each side's F1, with the paired bootstrap's percentile
    intervals over sentences (module docstring) and B - A's; rare types marked. Each argument holds
    one set of (type, first word, last word) per sentence: gold's as seqeval's get_entities reads
    the tags, a side's from its file. The F1 is seqeval's (per type, its default mode): 2 TP /
    (predicted + gold) over those entities, the very statistic the resamples take, so the interval
    is about the number it brackets; seqeval's own report would read the tags again, at seconds
    for a few thousand sentences."""
    from scipy.stats import bootstrap

    types = sorted({e[0] for side in (gold, a, b) for s in side for e in s})
    if not types:
        return []
    t = {name: i for i, name in enumerate(types)}

    def counts(sentences) -> np.ndarray:
        """Per type x sentence: how many entities."""
        c = np.zeros((len(types), len(gold)), dtype=np.int32)
        for j, s in enumerate(sentences):
            for e in s:
                c[t[e[0]], j] += 1
        return c

    n_gold = counts(gold)
    # per type x sentence: TP, and predicted + gold, on each side (F1 = 2 TP / (predicted + gold)):
    # four arrays, not five, since copying them into each resample is the bootstrap's cost
    tp_a, tp_b = (counts(s & g for s, g in zip(side, gold)) for side in (a, b))
    data = (tp_a, counts(a) + n_gold, tp_b, counts(b) + n_gold)
    point = _f1_stat(*data)
    if len(gold) < 2:  # nothing to resample
        low = high = np.full(point.shape, math.nan)
    else:
        # percentile, not BCa: its jackknife takes the statistic once per left-out sentence, O(n^2) work
        res = bootstrap(data, _f1_stat, n_resamples=BOOTSTRAP_RESAMPLES, paired=True, vectorized=True, axis=-1,
                        method="percentile", batch=100, rng=np.random.default_rng(BOOTSTRAP_SEED))
        low, high = res.confidence_interval
    k = len(types)

    def estimate(i: int) -> Estimate:
        return Estimate(float(point[i]), float(low[i]), float(high[i]))

    per_type = n_gold.sum(axis=1)
    return [TypeF1(name, int(per_type[i]), int(per_type[i]) < RARE_BELOW, estimate(i), estimate(k + i),
                   estimate(2 * k + i)) for i, name in enumerate(types)]


def _f1_stat(tp_a, total_a, tp_b, total_b, axis=-1):
    """Each type's F1 on A, on B, and B - A (stacked) from per-sentence TP and predicted + gold:
    2 TP / (predicted + gold), 0 where a resample holds neither (seqeval's zero_division=0)."""
    def f1(tp, total):
        total = total.sum(axis=axis)
        return np.divide(2.0 * tp.sum(axis=axis), total, out=np.zeros(total.shape), where=total > 0)

    a, b = f1(tp_a, total_a), f1(tp_b, total_b)
    return np.concatenate([a, b, b - a], axis=0)


# ------------------------------------------------------------------ the files

def _check_same(head_a: dict, head_b: dict) -> None:
    for side, head in (("A", head_a), ("B", head_b)):
        if head.get("format") != FORMAT:
            raise ValueError(f"compare: {side} ({_label(head)}): format {head.get('format')!r}, not {FORMAT}")
        if head.get("task") not in TASKS:
            raise ValueError(f"compare: {side} ({_label(head)}): unknown task {head.get('task')!r}")
    for key, what in (("task", "tasks"), ("split", "splits"), ("data", "data fingerprints")):
        if head_a.get(key) != head_b.get(key):
            raise ValueError(f"compare: A ({_label(head_a)}) and B ({_label(head_b)}) differ in their {what} "
                             f"({head_a.get(key)!r} vs {head_b.get(key)!r}): their predictions are not "
                             "of the same rows")


def _by_id(rows: list[dict], head: dict, side: str) -> dict[str, dict]:
    if head.get("rows") is not None and head["rows"] != len(rows):
        raise ValueError(f"compare: {side} ({_label(head)}): the header says {head['rows']} rows, the file holds "
                         f"{len(rows)}")
    found = {}
    for row in rows:
        if str(row["id"]) in found:
            raise ValueError(f"compare: {side} ({_label(head)}): id {row['id']!r} appears twice")
        found[str(row["id"])] = row
    return found


def _id(ids: dict[str, int], label, side: str) -> int:
    if str(label) not in ids:
        raise ValueError(f"compare: {side.upper()}: label {label!r} is not in its header's labels {list(ids)}")
    return ids[str(label)]


def _run(head: dict) -> dict:
    return {k: head.get(k) for k in ("model", "precision", "seed")}


def _precision(run: dict) -> str:
    return "FP32" if run.get("precision") == "fp32" else str(run.get("precision"))  # as the report writes it


def _label(run: dict, other: dict | None = None) -> str:
    """A run in words: its precision, with the seed where the other side's precision is the same
    (two seeds of one setup); model, precision and seed where there is no other side."""
    if other is None:
        return f"{run.get('model')}, {run.get('precision')}, seed {run.get('seed')}"
    if other.get("precision") == run.get("precision"):
        return f"{_precision(run)} seed {run.get('seed')}"
    return _precision(run)


def _noise_words(noise: PairComparison) -> str:
    if noise.a.get("precision") == noise.b.get("precision") and noise.a.get("model") == noise.b.get("model"):
        return f"two {_precision(noise.a)} seeds"
    return f"{_label(noise.a)} and {_label(noise.b)}"


def _noun(c: PairComparison, form: str) -> str:
    if c.unit == "entities":
        return "predicted entities"
    if c.unit == "questions":
        return "answers" if form == "amp" else "questions"
    return "predictions" if form == "amp" else "rows"


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
