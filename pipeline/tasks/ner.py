"""Bangla health NER (Bangla-HealthNER JSON) as token classification.

File format: a JSON list of rows {"text": "space separated words", "labels": ["O", "B-Symptom", ...]},
one IOB tag per whitespace-separated word of `text` (errors name "row N", the N-th element of
the list, from 1). Seven entity types: Symptom, Health Condition, Age, Medicine, Dosage, Medical
Procedure, Specialist. Metrics: seqeval entity-level micro precision/recall/F1 (F1 is the main
metric) and F1 per type.

Tag encoding: the canonical tags write the type as the dataset names it, with a space
("B-Health Condition", "I-Medical Procedure"); that is what the model's id2label, the report and
seqeval see, and what the sample set writes. On input the underscore form ("B-Health_Condition")
and any letter case are accepted and mapped to the canonical tag. Per-type metric keys are
`f1_<type>` lower-cased with spaces as underscores (`f1_health_condition`).

Words are split with str.split() (the data has non-breaking spaces) and normalized one by one,
so words and tags stay aligned; a word the normalizer empties keeps its original form.

Hub data (`hub:ID[:CONFIG]`) may use the same schema or the wikiann one (tokens, ner_tags as a
ClassLabel sequence); the label set is then the dataset's ClassLabel names.
"""
from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import numpy as np
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from pipeline.errors import UserError
from pipeline.tasks.base import Task, normalize_texts, read_text
from pipeline.tasks.samples import BN_DIGITS, zipf

TYPES = ["Symptom", "Health Condition", "Age", "Medicine", "Dosage", "Medical Procedure", "Specialist"]
LABELS = ["O"] + [f"{prefix}-{t}" for t in TYPES for prefix in "BI"]
IGNORE = -100  # the label/prediction value of positions that are not a word's first sub-word
SAMPLE_SIZES = {"train": 1500, "dev": 300, "test": 300}
LABEL_NOISE = 0.05
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


class NerTask(Task):
    name = "ner"
    main_metric = "f1"
    model_class = AutoModelForTokenClassification
    group_by_length = False
    """Grouped batches lowered the dev entity F1 beyond the seed spread (0.75 vs 0.86, 3 seeds)."""

    state_attributes = ("labels", "max_length", "_loaded")

    def __init__(self, options: dict | None = None):
        super().__init__(options)
        for key in self.options:
            raise UserError(f"config: task_options.{key}: unknown option (task ner takes none)")
        self.labels = list(LABELS)
        self.max_length: int | None = None  # set by featurize: the fixed width of predictions
        self._loaded = False  # once a split is read, the label set is fixed

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        out = {}
        for offset, (split, n) in enumerate(SAMPLE_SIZES.items()):
            rng = random.Random(2000 + offset)
            rows = [sample_row(rng, split) for _ in range(n)]
            path = directory / f"{split}.json"
            path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            out[split] = path
        return out

    def resolve_source(self, source: str | None, split: str) -> str:
        if source is None and self.labels != LABELS:  # the sample set's tags cannot mix with a hub tag set
            raise UserError(f"data.{split}: unset, so the built-in sample set, whose tags differ from the other "
                            f"splits' ({', '.join(self.labels)}): set data.{split} too")
        return super().resolve_source(source, split)

    def read_file(self, path: Path) -> list[dict]:
        try:
            rows = json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(rows, list):
            raise UserError(f"{path}: top level is {JSON_TYPES.get(type(rows), 'a value')}, expected a list of rows")
        if not rows:
            raise UserError(f"{path}: no rows")
        return self._validate(enumerate(rows, 1), str(path))

    def from_hub_rows(self, rows, source: str) -> list[dict]:
        columns = set(rows.features)
        if {"tokens", "ner_tags"} <= columns:  # wikiann schema: tag ids named by the ClassLabel
            names = getattr(getattr(rows.features["ner_tags"], "feature", None), "names", None)
            if names:
                self._set_labels(list(names), source)
            numbered = ((i + 1, {"tokens": r["tokens"],
                                 "labels": [names[t] for t in r["ner_tags"]] if names else r["ner_tags"]})
                        for i, r in enumerate(rows))
        elif {"text", "labels"} <= columns:
            numbered = ((i + 1, {"text": r["text"], "labels": r["labels"]}) for i, r in enumerate(rows))
        else:
            raise UserError(f"{source}: columns {', '.join(sorted(columns))}: expected text + labels "
                            "(Bangla-HealthNER) or tokens + ner_tags (wikiann)")
        return self._validate(numbered, source)

    def _set_labels(self, names: list[str], source: str) -> None:
        bad = [n for n in names if n != "O" and not re.match(r"^[BI]-.", n)]
        if bad:
            raise UserError(f"{source}: ner_tags names {bad[:3]} are not IOB tags (O, B-TYPE, I-TYPE)")
        if self._loaded and names != self.labels:
            raise UserError(f"{source}: tag names ({', '.join(names)}) differ from the other splits' "
                            f"({', '.join(self.labels)})")
        self.labels = names

    def _validate(self, rows, where: str) -> list[dict]:
        lookup = {form.lower(): tag for tag in self.labels
                  for form in (tag, tag.replace(" ", "_"), tag.replace("_", " "))}
        types = sorted({tag[2:] for tag in self.labels if tag != "O"})
        examples, n = [], 0

        def fail(reason):
            raise UserError(f"{where}: row {n}: {reason}")

        for n, row in rows:  # noqa: B007 - fail() reads `n`
            if not isinstance(row, dict):
                fail(f"expected an object with text and labels, got {JSON_TYPES.get(type(row), 'a value')}")
            if "tokens" in row:
                words = [str(w) for w in row["tokens"] or []]
            else:
                text = row.get("text")
                if not isinstance(text, str):
                    fail("missing text" if text is None else f"text is {JSON_TYPES.get(type(text), 'a value')}, "
                                                             "expected a string")
                words = text.split()
            if not words:
                fail("empty text")
            labels = row.get("labels")
            if not isinstance(labels, list):
                fail("missing labels" if labels is None else f"labels is {JSON_TYPES.get(type(labels), 'a value')}, "
                                                             "expected a list of tags")
            if len(words) != len(labels):
                fail(f"{len(words)} words but {len(labels)} labels")
            tags = []
            for j, (word, tag) in enumerate(zip(words, labels), 1):
                canonical = lookup.get(tag.strip().lower()) if isinstance(tag, str) else None
                if canonical is None:
                    fail(f"word {j} ({word!r}): unknown tag {tag!r} (expected O, or B-/I- with one of "
                         f"{', '.join(types)})")
                tags.append(canonical)
            examples.append({"words": words, "tags": tags})
        self._loaded = True
        # word by word keeps the alignment; a word the normalizer empties keeps its label
        normalized = iter(normalize_texts([w for e in examples for w in e["words"]]))
        for e in examples:
            e["words"] = [next(normalized).strip() or w for w in e["words"]]
        return examples

    def texts(self, examples):
        return [" ".join(e["words"]) for e in examples]

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "label2id": {l: i for i, l in enumerate(self.labels)}}

    def featurize(self, examples, tokenizer, max_length, split):
        import datasets

        self.max_length = max_length
        label_id = {l: i for i, l in enumerate(self.labels)}
        ds = datasets.Dataset.from_dict({
            "words": [e["words"] for e in examples],
            "tags": [[label_id[t] for t in e["tags"]] for e in examples],
            "idx": list(range(len(examples))),
        })

        def tokenize(batch):
            enc = tokenizer(batch["words"], is_split_into_words=True, truncation=True, max_length=max_length)
            enc["labels"], enc["word_starts"] = [], []
            for i, tags in enumerate(batch["tags"]):
                # only a word's first sub-word carries its label; word_starts maps each word to that
                # position (-1: the word was cut off by truncation or has no tokens)
                labels, starts, previous = [], [-1] * len(tags), None
                for pos, w in enumerate(enc.word_ids(i)):
                    first = w is not None and w != previous
                    labels.append(tags[w] if first else IGNORE)
                    if first:
                        starts[w] = pos
                    previous = w
                enc["labels"].append(labels)
                enc["word_starts"].append(starts)
            return enc

        return self.map_batched(ds, tokenize, remove_columns=["words", "tags"])

    def collator(self, tokenizer):
        return functools.partial(_collate, DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE))

    def predictions(self, outputs, batch):
        pred = outputs.logits.argmax(-1).cpu().numpy()
        # a fixed width, so batches (and ranks) of different lengths concatenate
        out = np.full((len(pred), max(self.max_length or 0, pred.shape[1])), IGNORE, dtype=np.int64)
        out[:, : pred.shape[1]] = pred
        return {"token_labels": out}

    kd_outputs = {"logits": True}  # per token

    def kd_pairs(self, student_outputs, teacher, batch):
        """Distil on labelled tokens only (first sub-words), not on padding or continuations."""
        mask = batch["labels"] != IGNORE
        return [(student_outputs["logits"][mask], teacher["logits"][mask])]

    def word_tags(self, predictions, features) -> list[list[str]]:
        """Predicted tag of every word: its first sub-word's; a word cut off by truncation is "O"."""
        return [[self.labels[row[s]] if s >= 0 else "O" for s in starts]
                for row, starts in zip(predictions["token_labels"], features["word_starts"])]

    def metrics(self, predictions, examples, features):
        y_true = [e["tags"] for e in examples]
        y_pred = self.word_tags(predictions, features)
        # mode=None: seqeval's default, conlleval-compatible scoring. An I- tag that does not
        # continue an entity of its type starts one, as the CoNLL script (and the published
        # Bangla NER scores) count it; strict IOB2 mode would silently drop such entities.
        scores = {
            "precision": float(precision_score(y_true, y_pred, zero_division=0)),
            "recall": float(recall_score(y_true, y_pred, zero_division=0)),
            "f1": float(f1_score(y_true, y_pred, zero_division=0)),
        }
        per_type = classification_report(y_true, y_pred, output_dict=True, zero_division=0) \
            if has_entities(y_true, y_pred) else {}  # seqeval's report fails on no entities at all
        for t in sorted({tag[2:] for tag in self.labels if tag != "O"}):
            # every type gets a key (0 when never seen nor predicted), so MLflow series stay aligned
            scores[f"f1_{t.lower().replace(' ', '_')}"] = float(per_type.get(t, {}).get("f1-score", 0.0))
        return scores

    def report(self, predictions, examples, features):
        y_true, y_pred = [e["tags"] for e in examples], self.word_tags(predictions, features)
        if not has_entities(y_true, y_pred):
            return "no entities in the gold tags or the predictions\n"
        return classification_report(y_true, y_pred, digits=4, zero_division=0)


def has_entities(*sequences) -> bool:
    return any(tag != "O" for tags in sequences for seq in tags for tag in seq)


def _collate(pad, features):
    # word_starts is for metrics only: the model must not see it
    return pad([{k: v for k, v in f.items() if k != "word_starts"} for f in features])


# ---------------------------------------------------------------------- built-in sample set
# Composed here from small word lists (no dataset content); a few rows are written in romanized
# Bangla (Banglish). The words alone do not settle the tags, the context does:
# - names are long-tailed, and the last HELD_OUT names of each list never occur in training,
#   so dev and test hold entities only their context can type;
# - a number is an Age ("৫ বছরের"), a Dosage ("৫০০ মিলিগ্রাম") or no entity at all ("৩ দিন ধরে");
# - a word can be a Symptom or a Health Condition by the template's slot ("এলার্জি হচ্ছে" vs
#   "এলার্জি হলে কোন বিশেষজ্ঞ"); an entity word can be part of a longer entity of another type
#   ("ডায়াবেটিস বিশেষজ্ঞ" is a Specialist) or no entity ("পরীক্ষা" in "স্কুলের পরীক্ষা", an exam).

BN = {
    "Symptom": ["জ্বর", "কাশি", "মাথাব্যথা", "বমি", "গলা ব্যথা", "পেট ব্যথা", "শ্বাসকষ্ট", "দুর্বলতা", "বুক ধড়ফড়",
                "চুলকানি", "ডায়রিয়া", "মাথা ঘোরা", "কোমর ব্যথা", "অরুচি"],
    "Health Condition": ["ডায়াবেটিস", "উচ্চ রক্তচাপ", "হাঁপানি", "টাইফয়েড", "ডেঙ্গু", "নিউমোনিয়া", "জন্ডিস",
                         "কিডনির রোগ", "গ্যাস্ট্রিক আলসার", "থাইরয়েড সমস্যা", "মাইগ্রেন", "রক্তশূন্যতা"],
    "Medicine": ["প্যারাসিটামল", "অ্যান্টাসিড", "ওমিপ্রাজল", "মেটফরমিন", "ইনসুলিন", "অ্যাজিথ্রোমাইসিন",
                 "সালবিউটামল", "ওআরএস", "হিস্টাসিন", "ভিটামিন ডি", "সেফিক্সিম", "মন্টিলুকাস্ট"],
    "Medical Procedure": ["রক্ত পরীক্ষা", "এক্সরে", "আলট্রাসনোগ্রাম", "ইসিজি", "সিটি স্ক্যান", "এন্ডোস্কপি",
                          "অপারেশন", "প্রস্রাব পরীক্ষা", "এমআরআই", "ডায়ালাইসিস"],
    "Specialist": ["মেডিসিন বিশেষজ্ঞ", "শিশু বিশেষজ্ঞ", "হৃদরোগ বিশেষজ্ঞ", "চর্মরোগ বিশেষজ্ঞ", "গাইনি ডাক্তার",
                   "নাক কান গলা বিশেষজ্ঞ", "নিউরোলজিস্ট", "ডায়াবেটিস বিশেষজ্ঞ", "কিডনি বিশেষজ্ঞ"],
    "Dosage": ["দিনে দুইবার", "দিনে তিনবার", "এক চামচ", "আধা চামচ", "রাতে একটা", "খাওয়ার পরে একটা",
               "{n} মিলিগ্রাম", "{n} ফোঁটা"],
}
ROMAN = {
    "Symptom": ["jor", "kashi", "matha betha", "bomi", "pet betha", "shash kosto", "durbolota"],
    "Health Condition": ["diabetes", "high pressure", "dengue", "typhoid", "jondis", "hapani"],
    "Medicine": ["paracetamol", "antacid", "omeprazole", "insulin", "ors", "metformin"],
    "Medical Procedure": ["blood test", "xray", "ultrasound", "ecg", "ct scan"],
    "Specialist": ["medicine specialist", "shishu specialist", "heart specialist", "skin er doctor"],
    "Dosage": ["dine duibar", "dine tinbar", "ek chamoch", "rate ekta", "{n} mg"],
}
HELD_OUT = 3
"""The last names of each Bangla list (one of each romanized list) occur only in dev and test."""
EITHER = ["এলার্জি", "অ্যাসিডিটি", "ডায়রিয়া", "জ্বর", "কোষ্ঠকাঠিন্য"]
"""Words that are a Symptom or a Health Condition, whichever slot of the template they fill."""
EITHER_SHARE = 0.25
BN_TEMPLATES = [
    "আমার {Age} ছেলের {Symptom} আর {Symptom} হচ্ছে , কী করব ?",
    "{Symptom} থাকলে কি {Health Condition} হতে পারে ?",
    "ডাক্তার {Medicine} {Dosage} খেতে বলেছেন ।",
    "{Health Condition} হলে কোন {Specialist} দেখাব ?",
    "{Specialist} আমাকে {Medical Procedure} করতে বলেছেন ।",
    "{Medicine} খাওয়ার পরেও {Symptom} কমছে না ।",
    "আমার মায়ের বয়স {Age} , তার {Health Condition} আছে ।",
    "{Symptom} {Symptom} নিয়ে খুব কষ্টে আছি ।",
    "{Medical Procedure} করার আগে কি {Medicine} বন্ধ রাখতে হবে ?",
    "{days} দিন ধরে আমার {Symptom}",
    "রিপোর্ট দেখে {Specialist} বললেন {Health Condition}",
    "{Age} বাচ্চাকে {Medicine} {Dosage} দেওয়া যাবে কি ?",
    "{days} দিন আগে {Medical Procedure} করিয়েছি , রিপোর্ট {price} টাকা নিয়েছে ।",
    "{Health Condition} এর জন্য {Medicine} খাচ্ছি , {Symptom} হলে কী করব ?",
    "আমার বাবা {Age} , {days} বছর ধরে {Health Condition} এ ভুগছেন ।",
    "আজ সকালে হাসপাতালে অনেক ভিড় ছিল ।",
    "কাল ছেলের স্কুলের পরীক্ষা , রাত {hour}টায় ঘুমাতে গেছে ।",
    "ধন্যবাদ , এখন অনেক ভালো আছি ।",
    "ডাক্তারের সিরিয়াল পেতে {days} দিন লেগেছে ।",
]
ROMAN_TEMPLATES = [
    "amar {Symptom} hocche , ki korbo ?",
    "doctor {Medicine} {Dosage} khete bolechen",
    "{Health Condition} hole kon {Specialist} dekhabo ?",
    "{Specialist} {Medical Procedure} korte bolse",
    "amar {Age} meyer {Symptom} kombe kobe ?",
    "{days} din dhore {Symptom} , {Medicine} khabo ?",
]
BN_AGE_UNITS = ["বছরের", "বছর", "মাসের"]
ROMAN_AGE_UNITS = ["bochorer", "bochor", "masher"]
NUMBERS = {"days": (2, 15), "price": (200, 3000), "hour": (9, 12)}
"""Numbers that are no entity: how long, how much, what time."""


def sample_row(rng: random.Random, split: str = "train") -> dict:
    roman = rng.random() < 0.15
    template = rng.choice(ROMAN_TEMPLATES if roman else BN_TEMPLATES)
    words, labels = [], []
    for piece in re.split(r"(\{[^}]+\})", template):
        if not piece.startswith("{"):
            words += piece.split()
            labels += ["O"] * len(piece.split())
            continue
        name = piece[1:-1]
        if name in NUMBERS:
            value = _number(rng, *NUMBERS[name], roman)
            words.append(value)
            labels.append("O")
            continue
        span = _entity(rng, name, roman, split).split()
        words += span
        labels += [f"B-{name}"] + [f"I-{name}"] * (len(span) - 1)
    if rng.random() < LABEL_NOISE:  # label noise: one entity gets another type, or none
        _relabel(rng, labels)
    sep = [" "] * (len(words) - 1)
    if sep and rng.random() < 0.1:  # messy spacing, as in real comments
        sep[rng.randrange(len(sep))] = rng.choice(["\u00a0", "  "])
    return {"text": "".join(w + s for w, s in zip(words, sep + [""])), "labels": labels}


def _number(rng: random.Random, low: int, high: int, roman: bool) -> str:
    n = str(rng.randint(low, high))
    return n if roman else n.translate(BN_DIGITS)


def _entity(rng: random.Random, etype: str, roman: bool, split: str) -> str:
    if etype == "Age":
        n = rng.randint(1, 12) if rng.random() < 0.5 else rng.randint(20, 80)
        return f"{_number(rng, n, n, roman)} {rng.choice(ROMAN_AGE_UNITS if roman else BN_AGE_UNITS)}"
    if not roman and etype in ("Symptom", "Health Condition") and rng.random() < EITHER_SHARE:
        return rng.choice(EITHER)
    names = (ROMAN if roman else BN)[etype]
    if split == "train":
        names = names[: -(1 if roman else HELD_OUT)]
    return zipf(rng, names, 0.8).replace("{n}", _number(rng, 1, 500, roman))


def _relabel(rng: random.Random, labels: list[str]) -> None:
    starts = [i for i, l in enumerate(labels) if l.startswith("B-")]
    if not starts:
        return
    i = rng.choice(starts)
    new = rng.choice([t for t in TYPES if t != labels[i][2:]] + [None])
    j = i + 1
    while j < len(labels) and labels[j].startswith("I-"):
        j += 1
    labels[i:j] = ["O"] * (j - i) if new is None else [f"B-{new}"] + [f"I-{new}"] * (j - i - 1)
