"""Extractive QA in the squad_bn schema (SQuAD v2 style: unanswerable questions included).

Files: JSON Lines (one {id, title, context, question, answers{text, answer_start}} per line,
the squad_bn layout) or the nested SQuAD v2 JSON document ({"data": [{"paragraphs": [{"context",
"qas": [...]}]}]}), told apart by content. Hub rows (squad_bn, squad_v2) share the flat schema.

Normalization keeps answer offsets right: answer_start is checked against the raw context,
then the context is cut at every answer boundary, each piece goes through normalizer.normalize
on its own, and the new offsets are the lengths of the normalized pieces before each cut.

Long contexts become overlapping windows (the tokenizer's stride/overflow); predictions are
the best span over all windows of an example, or "" when the null (CLS) score is higher.
"""
from __future__ import annotations

import collections
import json
import re
import string
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from normalizer import normalize
from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding

from pipeline.errors import UserError
from pipeline.tasks.base import Collate, Task, example_ids, logits_to_numpy
from pipeline.tasks.readers import read_json_lines, read_text
from pipeline.tasks.samples import qa as sample_set
from pipeline.tasks.workers import in_workers

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import ModelOutput
OPTIONS = {"stride": None, "n_best": 20, "max_answer_length": 30}  # stride None = max_length // 4
NEG = -1e9  # pads logits to a fixed width; never wins a max, and sums stay finite in float32
TARGETS = ("start_positions", "end_positions")


class Answer(NamedTuple):
    """An example's answer over all its windows (QaTask.answers)."""

    text: str
    """The best span's text."""
    score: float
    """Its start + end logit; -inf where no span is valid."""
    null_score: float
    """The lowest CLS start + end logit over the windows: the no-answer score."""

    @property
    def pred(self) -> str:
        return "" if self.null_score > self.score else self.text


class QaTask(Task):
    name = "qa"
    main_metric = "f1"
    tie_breakers = ("exact",)
    model_class = AutoModelForQuestionAnswering
    serving_task = None
    """transformers 5 removed the question-answering pipeline (transformers/pipelines/__init__.py
    raises KeyError for it), so MLflow's transformers flavor cannot express QA; the pytorch flavor
    would hold the module without the task's span decoding. tracking.log_model uploads best/."""
    epochs = 8
    """A model trained from scratch first sits on the null answer (F1 = the unanswerable share),
    then learns to point at the span next to the question's words; the distractors of the
    answer's own kind keep it below the ceiling. The default (preset:bangla-small, lr 3e-4, batch
    16) needs about 600 steps for that on the sample set's 1,200 questions: 8 epochs (3 ended near
    F1 0.2: benchmarks/studies/results/recipes-qa-epochs{3,8}-*.json). Real squad_bn has tens of times the
    questions, so 3 epochs there already take tens of times those steps: train.epochs=3 saves
    the rest (not measured on it)."""

    state_attributes = ("max_length",)

    def __init__(self, options: dict | None = None):
        super().__init__(options)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise UserError(f"config: task_options.{unknown[0]}: unknown option for task qa "
                            f"(known: {', '.join(OPTIONS)})")
        for key, default in OPTIONS.items():
            value = self.options.setdefault(key, default)
            lowest = 0 if key == "stride" else 1
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < lowest):
                raise UserError(f"config: task_options.{key}={value!r}: must be an integer >= {lowest}")
        self.max_length: int | None = None  # set by featurize; predictions() pads to it

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        return sample_set.write(directory)

    def read_file(self, path: Path) -> list[dict]:
        text = read_text(path)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            doc = None
            first = text.lstrip().split("\n", 1)[0]
            if not _parses(first):  # not JSON Lines either: a broken JSON document
                raise UserError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
        if isinstance(doc, dict) and "data" in doc:
            return in_workers(self._example, [(row, f"{path}: {where}") for where, row in _nested_rows(doc, path)])
        return in_workers(self._example, [(row, f"{path}: line {n}") for n, row in read_json_lines(path)])

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        return in_workers(self._example, [(dict(r), f"{source}: row {i + 1}") for i, r in enumerate(rows)])

    def _example(self, row: object, where: str) -> dict:
        """One validated, normalized example; every problem names `where` (file and row)."""
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
        missing = [k for k in ("id", "context", "question", "answers") if k not in row]
        if missing:
            raise UserError(f"{where}: missing field(s) {', '.join(missing)}")
        context, question, answers = row["context"], row["question"], row["answers"]
        for key, value in (("context", context), ("question", question)):
            if not isinstance(value, str):
                raise UserError(f"{where}: {key} must be a string, got {type(value).__name__}")
            if not value.strip():
                raise UserError(f"{where}: empty {key}")
        question = normalize(question).strip()
        if not question:  # e.g. only zero-width or control characters
            raise UserError(f"{where}: empty question after normalization")
        if not isinstance(answers, dict) or not all(isinstance(answers.get(k), list) for k in ("text", "answer_start")):
            raise UserError(f"{where}: answers must be an object with lists 'text' and 'answer_start'")
        texts, starts = answers["text"], answers["answer_start"]
        if len(texts) != len(starts):
            raise UserError(f"{where}: answers has {len(texts)} text(s) but {len(starts)} answer_start(s)")
        for text, start in zip(texts, starts):
            if not isinstance(text, str) or not text.strip():
                raise UserError(f"{where}: empty answer text")
            if not isinstance(start, int) or isinstance(start, bool) or start < 0:
                raise UserError(f"{where}: answer_start {start!r} is not an offset (an integer >= 0)")
            found = context[start:start + len(text)]
            if found != text:
                raise UserError(f"{where}: answer_start {start} does not match the context: "
                                f"context[{start}:{start + len(text)}] is {found!r}, expected {text!r}")
        context, spans = normalize_with_spans(context, [(s, s + len(t)) for t, s in zip(texts, starts)])
        gold = [context[s:e] for s, e in spans]
        if not all(t.strip() for t in gold):
            raise UserError(f"{where}: an answer is empty after normalization")
        return {"id": str(row["id"]), "title": str(row.get("title") or ""), "context": context,
                "question": question,
                "answers": {"text": gold, "answer_start": [s for s, _ in spans]}}

    def texts(self, examples: list[dict]) -> list[str]:
        contexts = dict.fromkeys(e["context"] for e in examples)  # each paragraph once, in order
        return [e["question"] for e in examples] + list(contexts)

    # ------------------------------------------------------------------ model side
    def featurize(self, examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_length: int,
                  split: str) -> datasets.Dataset:
        import datasets

        self.max_length = max_length
        questions, longest = _fit_questions([e["question"] for e in examples], tokenizer, max_length // 2)
        # the tokenizers library panics (no Python error) on a stride that leaves a window no
        # room to move forward: check it here
        room = max_length - tokenizer.num_special_tokens_to_add(pair=True) - longest
        stride = self.options["stride"]
        if stride is None:
            stride = max(0, min(max_length // 4, room - 1))
        elif stride >= room:
            raise UserError(f"config: task_options.stride={stride}: must be < {room}, the context tokens a "
                            f"window of train.max_length={max_length} holds next to the longest question")
        enc = tokenizer(questions, [e["context"] for e in examples], truncation="only_second", max_length=max_length,
                        stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
        example_of = enc.pop("overflow_to_sample_mapping")
        offsets = enc.pop("offset_mapping")
        columns = {k: list(v) for k, v in enc.items()}
        if split == "train":
            columns["start_positions"], columns["end_positions"] = zip(*(
                _target(examples[ex]["answers"], off, enc.sequence_ids(i))
                for i, (ex, off) in enumerate(zip(example_of, offsets))))
        else:  # post-processing maps tokens back to context characters; None = not context
            columns["example_index"] = list(example_of)
            columns["offset_mapping"] = [[tuple(o) if s == 1 else None for o, s in zip(off, enc.sequence_ids(i))]
                                         for i, off in enumerate(offsets)]
        columns["idx"] = list(range(len(example_of)))
        return datasets.Dataset.from_dict(columns)

    def collator(self, tokenizer: PreTrainedTokenizerBase) -> Collate:
        pad = DataCollatorWithPadding(tokenizer)
        keep = {*tokenizer.model_input_names, *TARGETS, "idx"}
        # eval features carry offset_mapping/example_index for post-processing: not model inputs
        return lambda features: pad([{k: v for k, v in f.items() if k in keep} for f in features])

    def loss(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy of the start and of the end position over the window's real tokens. The
        model's own loss also spreads probability over the padding, so its value and gradients
        would change with how far a batch is padded: with its longest window, with how a batch is
        split across ranks or grouped by length, which must not change what is learned."""
        padding = ~batch["attention_mask"].bool()
        cross_entropy = torch.nn.functional.cross_entropy
        return sum(cross_entropy(getattr(outputs, name).float().masked_fill(padding, NEG), batch[target])
                   for name, target in (("start_logits", "start_positions"), ("end_logits", "end_positions"))) / 2

    kd_outputs = {"start_logits": True, "end_logits": True}  # per position

    def kd_pairs(self, student_outputs: ModelOutput, teacher: dict[str, torch.Tensor],
                 batch: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Distil the start and the end distributions over the window's real positions."""
        padding = ~batch["attention_mask"].bool()
        return [(student_outputs[name].float().masked_fill(padding, -1e4),
                 teacher[name].float().masked_fill(padding, -1e4)) for name in self.kd_outputs]

    def predictions(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        out = {}
        for key in ("start_logits", "end_logits"):
            logits = logits_to_numpy(getattr(outputs, key))
            padded = np.full((len(logits), self.max_length), NEG, dtype=np.float32)
            padded[:, : logits.shape[1]] = logits
            out[key] = padded
        return out

    def answers(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> list[Answer]:
        """Per example, over all its windows: the best span's text and score, and the null score."""
        n_best, max_len = self.options["n_best"], self.options["max_answer_length"]
        best = [(-np.inf, "")] * len(examples)
        null = [np.inf] * len(examples)
        starts_all, ends_all = predictions["start_logits"], predictions["end_logits"]
        for i, (ex, offsets) in enumerate(zip(features["example_index"], features["offset_mapping"])):
            start, end = starts_all[i], ends_all[i]
            # the null score is the CLS pair; the lowest over windows, as windows without the
            # answer rightly point at CLS (the Hugging Face run_qa recipe)
            null[ex] = min(null[ex], float(start[0] + end[0]))
            context = examples[ex]["context"]
            for s in np.argsort(start)[::-1][:n_best]:
                for e in np.argsort(end)[::-1][:n_best]:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > max_len:
                        continue
                    score = float(start[s] + end[e])
                    if score > best[ex][0]:
                        best[ex] = (score, context[offsets[s][0]:offsets[e][1]])
        return [Answer(text, score, null[k]) for k, (score, text) in enumerate(best)]

    def postprocess(self, predictions: dict[str, np.ndarray], examples: list[dict],
                    features: datasets.Dataset) -> list[str]:
        """Best answer text per example over all its windows; "" when the null score wins."""
        return [a.pred for a in self.answers(predictions, examples, features)]

    def prediction_rows(self, predictions: dict[str, np.ndarray], examples: list[dict],
                        features: datasets.Dataset) -> list[dict]:
        """The answer given and the two scores it was chosen by (4 decimals: float32 logits)."""
        return [{"id": i, "pred": a.pred, "score": round(a.score, 4), "null_score": round(a.null_score, 4),
                 "gold": e["answers"]["text"], "has_answer": bool(e["answers"]["text"])}
                for i, e, a in zip(example_ids(examples), examples, self.answers(predictions, examples, features))]

    def stall(self, predictions: dict[str, np.ndarray], examples: list[dict],
              features: datasets.Dataset) -> str | None:
        """Every question answered "" although some have an answer: the null-answer plateau a
        model trained from scratch sits on first (F1 = the unanswerable share, HasAns 0)."""
        if not any(e["answers"]["text"] for e in examples):
            return None
        if any(self.postprocess(predictions, examples, features)):
            return None
        return "no question answered"

    scores_loss = False
    """Its dev and test windows carry no answer span (featurize keeps the targets for train only)."""

    def metric_names(self) -> tuple[str, ...]:
        return ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")  # squad_v2_scores

    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> dict[str, float]:
        return squad_v2_scores(self.postprocess(predictions, examples, features),
                               [e["answers"]["text"] for e in examples])

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        m = self.metrics(predictions, examples, features)
        has = sum(bool(e["answers"]["text"]) for e in examples)
        rows = [("all", len(examples), "exact", "f1"), ("HasAns", has, "HasAns_exact", "HasAns_f1"),
                ("NoAns", len(examples) - has, "NoAns_exact", "NoAns_f1")]
        lines = [f"{'subset':<8}{'questions':>10}{'exact':>9}{'f1':>9}"]
        lines += [f"{name:<8}{n:>10}{m[ex]:>9.4f}{m[f1]:>9.4f}" for name, n, ex, f1 in rows if n]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- reading


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def _nested_rows(doc: dict, path: Path) -> Iterator[tuple[str, dict]]:
    """(location, flat squad_bn row) for every question of a nested SQuAD v2 document."""
    def need(obj: object, key: str, kind: type, where: str) -> object:
        if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
            raise UserError(f"{path}: {where}: field {key} missing or not a {kind.__name__}")
        return obj[key]

    found = False
    for i, article in enumerate(need(doc, "data", list, "top level")):
        for j, para in enumerate(need(article, "paragraphs", list, f"data[{i}]")):
            context = need(para, "context", str, f"data[{i}].paragraphs[{j}]")
            for k, qa in enumerate(need(para, "qas", list, f"data[{i}].paragraphs[{j}]")):
                where = f"data[{i}].paragraphs[{j}].qas[{k}]"
                if not isinstance(qa, dict):
                    raise UserError(f"{path}: {where}: expected a JSON object, got {type(qa).__name__}")
                answers = [] if qa.get("is_impossible") else qa.get("answers")
                if not isinstance(answers, list) or not all(isinstance(a, dict) and {"text", "answer_start"} <= a.keys()
                                                            for a in answers):
                    raise UserError(f"{path}: {where}: answers must be a list of {{text, answer_start}} objects")
                found = True
                yield where, {**qa, "title": article.get("title", ""), "context": context, "answers": {
                    "text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]}}
    if not found:
        raise UserError(f"{path}: no questions in data[].paragraphs[].qas[]")


def normalize_with_spans(context: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """normalizer.normalize(context) with character spans carried over.

    The context is cut at every span boundary and each piece is normalized alone, so a span's
    new offsets are the lengths of the normalized text before its cuts (normalize collapses
    whitespace and may change lengths, e.g. NFKC, so old offsets cannot be reused). Whitespace
    the normalizer would collapse across a cut is collapsed here; other rules cannot see
    across a cut, which matters only for a span that starts or ends inside a character cluster.
    """
    cuts = sorted({0, len(context), *(p for span in spans for p in span)})
    text, moved = "", {}
    for a, b in zip(cuts, cuts[1:]):
        piece = normalize(context[a:b])
        if text[-1:].isspace() and piece[:1].isspace():
            piece = piece[1:]
        moved[a] = len(text)
        text += piece
    moved[len(context)] = len(text)
    lead = len(text) - len(text.lstrip())
    text = text.strip()

    def at(p: int) -> int:
        return min(max(moved[p] - lead, 0), len(text))

    return text, [(at(s), at(e)) for s, e in spans]


# ---------------------------------------------------------------------- features


def _fit_questions(questions: list[str], tokenizer: PreTrainedTokenizerBase, limit: int) -> tuple[list[str], int]:
    """Questions cut to `limit` tokens (so only_second truncation always leaves context room)
    and the longest one's length."""
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    fitted = [q if len(ids) <= limit else q[: offsets[limit - 1][1]]
              for q, ids, offsets in zip(questions, enc["input_ids"], enc["offset_mapping"])]
    return fitted, min(limit, max((len(ids) for ids in enc["input_ids"]), default=0))


def _target(answers: dict, offsets: list[tuple[int, int]], sequence_ids: list[int | None]) -> tuple[int, int]:
    """Token positions of the first gold answer in one window; (0, 0) = CLS, the null answer."""
    if not answers["text"]:
        return 0, 0
    start = answers["answer_start"][0]
    end = start + len(answers["text"][0])
    context = [i for i, s in enumerate(sequence_ids) if s == 1]
    if not context:
        return 0, 0
    first, last = context[0], context[-1]
    if offsets[first][0] > start or offsets[last][1] < end:  # not wholly inside this window
        return 0, 0
    tok_start = next(i for i in range(first, last + 1) if offsets[i][1] > start)
    tok_end = next(i for i in range(last, first - 1, -1) if offsets[i][0] < end)
    return tok_start, tok_end


# ---------------------------------------------------------------------- metrics
# The official SQuAD v2 scoring, written here because no installed library has it (the
# `evaluate` package is not a dependency, and transformers 5 dropped its squad_metrics). The
# answer normalization also strips Bangla punctuation, which the English script keeps.

PUNCT = set(string.punctuation) | {"\u0964", "\u0965"} | {  # danda, double danda
    chr(c) for c in range(0x0980, 0x0A00) if unicodedata.category(chr(c))[0] in "PS"}  # ৺ ৽ ৲ ৳ ৻
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation (ASCII and Bangla), English articles and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in PUNCT)
    return " ".join(ARTICLES.sub(" ", s).split())


def exact_score(gold: str, pred: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    gold_toks, pred_toks = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not gold_toks or not pred_toks:  # a null answer scores only against a null answer
        return float(gold_toks == pred_toks)
    common = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_toks), common / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def squad_v2_scores(preds: list[str], golds: list[list[str]]) -> dict[str, float]:
    """exact and f1 (fractions in [0, 1]) over all questions, plus HasAns_/NoAns_ breakdowns
    for the subsets that are not empty. The max over gold answers counts; a question without
    gold answers (or whose golds normalize to nothing) is right only with ""."""
    exact, f1, has_answer = [], [], []
    for pred, answers in zip(preds, golds):
        candidates = [a for a in answers if normalize_answer(a)] or [""]
        exact.append(max(exact_score(a, pred) for a in candidates))
        f1.append(max(f1_score(a, pred) for a in candidates))
        has_answer.append(bool(answers))
    exact, f1, has_answer = np.array(exact), np.array(f1), np.array(has_answer, dtype=bool)
    scores = {"exact": float(exact.mean()), "f1": float(f1.mean())}
    for name, mask in (("HasAns", has_answer), ("NoAns", ~has_answer)):
        if mask.any():
            scores[f"{name}_exact"] = float(exact[mask].mean())
            scores[f"{name}_f1"] = float(f1[mask].mean())
    return scores
