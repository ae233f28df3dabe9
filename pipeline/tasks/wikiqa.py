"""WikiQA answer selection: does a candidate sentence answer the question? (pair classification)

Files: the microsoft/wiki_qa schema (question_id, question, document_title, answer, label 0/1)
as .jsonl, .csv or .tsv, or the original WikiQA TSV release (QuestionID, Question, DocumentID,
DocumentTitle, SentenceID, Sentence, Label), told apart by the header. document_title and the
release's document/sentence ids are not needed and may be absent.

Metrics: precision, recall and F1 of the positive class (F1 is the main metric), accuracy, and
MAP and MRR over the questions that have at least one correct candidate (the standard filtered
evaluation), ranking each question's candidates by the positive-class score (logit difference);
tied scores count as the average over their orders (see ranking_scores).

The built-in sample set (train/dev/test.tsv in the hub schema, samples/wikiqa.py) is composed from
invented entities and templated facts: answers often paraphrased, and wrong candidates that share
the question's words.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import softmax
from sklearn.metrics import accuracy_score, classification_report, precision_recall_fscore_support

from pipeline.errors import UserError
from pipeline.tasks.base import Task, logits_to_numpy, missing_classes
from pipeline.tasks.readers import read_json_lines, read_lines, read_table
from pipeline.tasks.samples import wikiqa as sample_set

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import BatchEncoding, PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

LABELS = ["incorrect", "correct"]
# our name -> column name, per file schema
HUB_COLUMNS = {"qid": "question_id", "question": "question", "sentence": "answer", "label": "label"}
RELEASE_COLUMNS = {"qid": "QuestionID", "question": "Question", "sentence": "Sentence", "label": "Label"}
DELIMITERS = {".csv": ",", ".tsv": "\t"}


class WikiQaTask(Task):
    name = "wikiqa"
    main_metric = "f1"
    tie_breakers = ("map", "mrr")
    """F1 is 0.0 on every epoch that calls no candidate correct yet, while the ranking improves."""
    default_model = "sentence-transformers/all-MiniLM-L6-v2"
    holdout_group = "qid"
    """A held-out dev split takes whole questions: MAP and MRR rank each question's candidates."""
    group_by_length = False
    """Grouped batches lowered the test MAP beyond the seed spread (0.79 vs 0.86, 4 seeds)."""
    pretrained_lr = 1e-4
    """At 5e-5 the default model (a sentence encoder with a new 2-class head) called no candidate
    correct for whole epochs on some seeds; 1e-4 learned on every seed of 1-10 in the default 3
    epochs (benchmarks/studies/results/recipes-wikiqa-default-lr-seeds*.json). Real WikiQA (20k pairs, 17x the sample
    set's steps per epoch) was not measured."""

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        return sample_set.write(directory)

    def read_file(self, path: Path) -> list[dict]:
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return self._validate(read_json_lines(path), f"{path}: line", HUB_COLUMNS)
        if suffix not in DELIMITERS:
            raise UserError(f"{path}: unsupported file type {suffix or '(none)'} (expected .jsonl, .csv or .tsv)")
        delimiter = DELIMITERS[suffix]
        header = [c.strip() for c in next(read_lines(path)).split(delimiter)]
        if {"QuestionID", "Sentence"} & set(header):
            return self._validate(_release_rows(path), f"{path}: line", RELEASE_COLUMNS)
        rows = read_table(path, tuple(HUB_COLUMNS.values()), delimiter=delimiter)
        return self._validate(rows, f"{path}: line", HUB_COLUMNS)

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        return self._validate(((i + 1, dict(r)) for i, r in enumerate(rows)), f"{source}: row", HUB_COLUMNS)

    def _validate(self, rows: Iterable[tuple[int, dict]], where: str, columns: dict[str, str]) -> list[dict]:
        """`where` names the source and its unit: "FILE: line" or "hub:ID: row"."""
        examples = []
        for line, r in rows:
            missing = [c for c in columns.values() if c not in r]
            if missing:  # JSON lines and hub rows; tables are checked once by their header
                raise UserError(f"{where} {line}: missing field(s) {', '.join(missing)}")
            ex = {k: str(r[c] if r[c] is not None else "").strip() for k, c in columns.items()}
            for key in ("question", "sentence"):
                if not ex[key]:
                    raise UserError(f"{where} {line}: empty {columns[key]}")
            if ex["label"] not in ("0", "1"):
                raise UserError(f"{where} {line}: label {r[columns['label']]!r} is not 0 or 1")
            ex["label"] = int(ex["label"])
            ex["qid"] = ex["qid"] or ex["question"]  # no id: candidates of the same question group together
            examples.append(ex)
        if not examples:
            raise UserError(f"{where.rsplit(':', 1)[0]}: no data rows")
        return examples

    def texts(self, examples: list[dict]) -> list[str]:
        return list(dict.fromkeys(e["question"] for e in examples)) + [e["sentence"] for e in examples]

    def serving_inputs(self, examples: list[dict]) -> list:
        # text-classification on pairs: MLflow's pyfunc takes a list of {"text", "text_pair"} too
        return [{"text": e["question"], "text_pair": e["sentence"]} for e in examples]

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        return {"num_labels": 2, "id2label": dict(enumerate(LABELS)), "label2id": {l: i for i, l in enumerate(LABELS)}}

    def featurize(self, examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_length: int,
                  split: str) -> datasets.Dataset:
        import datasets

        def encode(b: dict[str, list]) -> BatchEncoding | dict[str, list]:
            try:  # cut the candidate sentence, never the question
                return tokenizer(b["question"], b["sentence"], truncation="only_second", max_length=max_length)
            except Exception:  # a question alone is longer than max_length: cut both for that pair
                rows = [_encode_pair(tokenizer, q, s, max_length) for q, s in zip(b["question"], b["sentence"])]
                return {k: [r[k] for r in rows] for k in rows[0]}

        ds = datasets.Dataset.from_dict({
            "question": [e["question"] for e in examples],
            "sentence": [e["sentence"] for e in examples],
            "labels": [e["label"] for e in examples],
            "idx": list(range(len(examples))),
        })
        return self.map_batched(ds, encode, remove_columns=["question", "sentence"])

    def predictions(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        logits = logits_to_numpy(outputs.logits)
        # the logit difference ranks like softmax's positive probability but does not saturate
        # at 1.0 (which would tie confident candidates)
        return {"logits": logits, "score": logits[:, 1] - logits[:, 0]}

    def metric_names(self) -> tuple[str, ...]:
        return ("precision", "recall", "f1", "accuracy", "map", "mrr")

    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> dict[str, float]:
        y_true = np.array([e["label"] for e in examples])
        score = predictions["score"]
        y_pred = (score > 0).astype(int)  # = argmax of the logits (a tie goes to "incorrect")
        p, r, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="binary", pos_label=1,
                                                      zero_division=0)
        ap, rr = ranking_scores([e["qid"] for e in examples], y_true, score)
        return {"precision": float(p), "recall": float(r), "f1": float(f1),
                "accuracy": float(accuracy_score(y_true, y_pred)), "map": ap, "mrr": rr}

    def stall(self, predictions: dict[str, np.ndarray], examples: list[dict],
              features: datasets.Dataset) -> str | None:
        """A model that calls no candidate correct (F1 0 whatever it ranks), or every one."""
        predicted = (predictions["score"] > 0).astype(int)
        if not missing_classes(predicted, np.array([e["label"] for e in examples]), len(LABELS)):
            return None
        return "every candidate predicted correct" if predicted.all() else "no candidate predicted correct"

    def prediction_labels(self) -> list[str]:
        return ["0", "1"]

    def prediction_rows(self, predictions: dict[str, np.ndarray], examples: list[dict],
                        features: datasets.Dataset) -> list[dict]:
        """A candidate's id is its question's and its place among the question's candidates; its score
        the positive class's probability, unrounded (rounded, confident candidates would tie)."""
        positive = softmax(predictions["logits"].astype(np.float64), axis=-1)[:, 1].tolist()
        predicted = (predictions["score"] > 0).astype(int).tolist()  # as metrics() calls it
        seen: dict[str, int] = {}
        rows = []
        for e, score, pred in zip(examples, positive, predicted):
            k = seen[e["qid"]] = seen.get(e["qid"], -1) + 1
            rows.append({"id": f"{e['qid']}:{k}", "question": e["qid"], "score": score, "pred": pred,
                         "gold": e["label"]})
        return rows

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        y_true = [e["label"] for e in examples]
        m = self.metrics(predictions, examples, features)
        return (classification_report(y_true, (predictions["score"] > 0).astype(int), labels=[0, 1],
                                      target_names=LABELS, digits=4, zero_division=0)
                + f"\nMAP {m['map']:.4f}  MRR {m['mrr']:.4f}  (questions with a correct candidate)\n")


def _release_rows(path: Path) -> list[tuple[int, dict]]:
    """Rows of the original release: TSV without quoting whose sentences hold bare quote marks, so
    it is read with quoting off (as the hub's wiki_qa loader read it); readers.read_table's csv
    quoting would merge lines at an unbalanced quote."""
    reader = csv.DictReader(read_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in RELEASE_COLUMNS.values() if c not in columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(columns)})")
    reader.fieldnames = columns
    return [(reader.line_num, {k: v or "" for k, v in row.items()}) for row in reader]


def _encode_pair(tokenizer: PreTrainedTokenizerBase, question: str, sentence: str, max_length: int) -> BatchEncoding:
    try:
        return tokenizer(question, sentence, truncation="only_second", max_length=max_length)
    except Exception:
        return tokenizer(question, sentence, truncation="longest_first", max_length=max_length)


# ---------------------------------------------------------------------- ranking metrics
# sklearn has no grouped ranking metric, and its average_precision_score scores a group of tied
# candidates as if all sat at the group's last rank; so MAP/MRR are computed here.
#
# Ties: the expected value over a uniformly random order of tied candidates (McSherry & Najork,
# ECIR 2008). Input order would reward a file whose answers come first (WikiQA lists sentences
# in document order), and the pessimistic order would penalize bf16, whose coarser logits tie
# more often. A model that scores everything alike gets exactly the chance level.


def ranking_scores(qids: Sequence, labels: Sequence[int] | np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(MAP, MRR) over the questions with at least one correct candidate; NaN if there is none
    (or if a score is NaN: a diverged model has no ranking)."""
    if np.isnan(scores).any():
        return math.nan, math.nan
    groups: dict = {}
    for i, q in enumerate(qids):
        groups.setdefault(q, []).append(i)
    aps, rrs = [], []
    for rows in groups.values():
        y, s = np.asarray(labels)[rows], np.asarray(scores)[rows]
        if y.sum() > 0:
            ap, rr = _expected_ap_rr(y, s)
            aps.append(ap)
            rrs.append(rr)
    return (float(np.mean(aps)), float(np.mean(rrs))) if aps else (math.nan, math.nan)


def _expected_ap_rr(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    """AP and reciprocal rank of one question, averaged over all orders of tied scores."""
    above = pos_above = 0  # candidates (and correct ones) ranked strictly higher
    precision_sum, rr = 0.0, None
    for value in np.unique(s)[::-1]:  # tie groups, best first
        t, m = int((s == value).sum()), int(y[s == value].sum())  # group size, correct in it
        for i in range(1, t + 1):  # group position i is correct w.p. m/t; if so, correct ones up to it:
            correct_up_to = pos_above + 1 + (i - 1) * (m - 1) / max(t - 1, 1)
            precision_sum += m / t * correct_up_to / (above + i)
        if rr is None and m:  # P(first correct at group position i) = C(t-i, m-1) / C(t, m)
            rr = sum(math.comb(t - i, m - 1) / math.comb(t, m) / (above + i) for i in range(1, t - m + 2))
        above, pos_above = above + t, pos_above + m
    return precision_sum / pos_above, rr
