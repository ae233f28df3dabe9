"""WikiQA answer selection: does a candidate sentence answer the question? (pair classification)

Files: the microsoft/wiki_qa schema (question_id, question, document_title, answer, label 0/1)
as .jsonl, .csv or .tsv, or the original WikiQA TSV release (QuestionID, Question, DocumentID,
DocumentTitle, SentenceID, Sentence, Label), told apart by the header. document_title and the
release's document/sentence ids are not needed and may be absent.

Metrics: precision, recall and F1 of the positive class (F1 is the main metric), accuracy, and
MAP and MRR over the questions that have at least one correct candidate (the standard filtered
evaluation), ranking each question's candidates by the positive-class score (logit difference);
tied scores count as the average over their orders (see ranking_scores).

The built-in sample set (train/dev/test.tsv in the hub schema) is composed from invented entities
and templated facts: 3-6 candidates per question, about 30% of the questions without an answer,
answers often paraphrased and wrong candidates that share the question's words (see below).
"""
from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import numpy as np
from sklearn.metrics import accuracy_score, classification_report, precision_recall_fscore_support

from pipeline.errors import UserError
from pipeline.tasks import samples
from pipeline.tasks.base import Task, logits_to_numpy, read_json_lines, read_lines, read_table

LABELS = ["incorrect", "correct"]
# our name -> column name, per file schema
HUB_COLUMNS = {"qid": "question_id", "question": "question", "sentence": "answer", "label": "label"}
RELEASE_COLUMNS = {"qid": "QuestionID", "question": "Question", "sentence": "Sentence", "label": "Label"}
DELIMITERS = {".csv": ",", ".tsv": "\t"}
SAMPLE_HEADER = ["question_id", "question", "document_title", "answer", "label"]  # the hub's columns

SAMPLE_SIZES = {"train": 1200, "dev": 300, "test": 600}  # candidate pairs per split
ANSWERED = 0.7  # fraction of questions with a correct candidate (~16% of the pairs)
LABEL_NOISE = 0.05
"""Share of the correct candidates labelled 0; as many wrong candidates are labelled 1 (in expectation).
Flipping 5% of all pairs instead would make a third of the rare positive labels noise."""


class WikiQaTask(Task):
    name = "wikiqa"
    main_metric = "f1"
    default_model = "sentence-transformers/all-MiniLM-L6-v2"
    group_by_length = False
    """Grouped batches lowered the test MAP beyond the seed spread (0.79 vs 0.86, 4 seeds)."""

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        return {split: samples.write_table(directory / f"{split}.tsv", SAMPLE_HEADER,
                                           _sample_rows(random.Random(2000 + offset), split, n), **samples.TSV)
                for offset, (split, n) in enumerate(SAMPLE_SIZES.items())}

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

    def from_hub_rows(self, rows, source: str) -> list[dict]:
        return self._validate(((i + 1, dict(r)) for i, r in enumerate(rows)), f"{source}: row", HUB_COLUMNS)

    def _validate(self, rows, where: str, columns: dict) -> list[dict]:
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

    def texts(self, examples):
        return list(dict.fromkeys(e["question"] for e in examples)) + [e["sentence"] for e in examples]

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        return {"num_labels": 2, "id2label": dict(enumerate(LABELS)), "label2id": {l: i for i, l in enumerate(LABELS)}}

    def featurize(self, examples, tokenizer, max_length, split):
        import datasets

        def encode(b):
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

    def predictions(self, outputs, batch):
        logits = logits_to_numpy(outputs.logits)
        # the logit difference ranks like softmax's positive probability but does not saturate
        # at 1.0 (which would tie confident candidates)
        return {"logits": logits, "score": logits[:, 1] - logits[:, 0]}

    def metrics(self, predictions, examples, features):
        y_true = np.array([e["label"] for e in examples])
        score = predictions["score"]
        y_pred = (score > 0).astype(int)  # = argmax of the logits (a tie goes to "incorrect")
        p, r, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="binary", pos_label=1,
                                                      zero_division=0)
        ap, rr = ranking_scores([e["qid"] for e in examples], y_true, score)
        return {"precision": float(p), "recall": float(r), "f1": float(f1),
                "accuracy": float(accuracy_score(y_true, y_pred)), "map": ap, "mrr": rr}

    def report(self, predictions, examples, features):
        y_true = [e["label"] for e in examples]
        m = self.metrics(predictions, examples, features)
        return (classification_report(y_true, (predictions["score"] > 0).astype(int), labels=[0, 1],
                                      target_names=LABELS, digits=4, zero_division=0)
                + f"\nMAP {m['map']:.4f}  MRR {m['mrr']:.4f}  (questions with a correct candidate)\n")


def _release_rows(path: Path) -> list[tuple[int, dict]]:
    """Rows of the original release: TSV without quoting whose sentences hold bare quote marks, so
    it is read with quoting off (as the hub's wiki_qa loader read it); base.read_table's csv
    quoting would merge lines at an unbalanced quote."""
    reader = csv.DictReader(read_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in RELEASE_COLUMNS.values() if c not in columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(columns)})")
    reader.fieldnames = columns
    return [(reader.line_num, {k: v or "" for k, v in row.items()}) for row in reader]


def _encode_pair(tokenizer, question, sentence, max_length):
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


def ranking_scores(qids, labels, scores) -> tuple[float, float]:
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


# ---------------------------------------------------------------------- sample set
# Invented entities (syllables and word lists written for this project), templated facts. What
# makes it WikiQA-like: the answer is often a paraphrase that shares few words with the question
# ("The government of Norvia sits in Ashford."), while wrong candidates share them ("Visitors to
# the capital of Norvia arrive from Saltford.", "Ashford was the capital of Norvia until 1820.",
# "Saltmouth is the capital of Keldia."): word overlap is a weak cue; the relation decides.
SYLLABLES = (["Nor", "Kel", "Val", "Dor", "Mar", "Tel", "Sar", "Bel", "Ost", "Lun", "Ar", "Zen"],
             ["via", "doria", "mark", "land", "ania", "esia", "ovia", "heim"])
CITY_PARTS = (["Port", "Ash", "Kings", "Red", "Fair", "Stone", "Lake", "Green", "Salt", "Iron"],
              ["haven", "ford", "bridge", "mouth", "field", "ton", "burg", "dale"])
ADJECTIVES = ["Silent", "Golden", "Broken", "Hidden", "Last", "Winter", "Crimson", "Distant", "Quiet", "Northern"]
NOUNS = ["River", "Garden", "Crown", "Harbor", "Letter", "Forest", "Mirror", "Orchard", "Lantern", "Voyage"]
FIRST_NAMES = ["Anna", "Tomas", "Elena", "Marcus", "Ines", "Pavel", "Clara", "Jonas", "Rosa", "Viktor"]
LAST_NAMES = ["Halden", "Moreau", "Castell", "Varga", "Lindqvist", "Okoro", "Brandt", "Ferreira", "Aalto", "Renner"]
BUILDINGS = ["Bridge", "Cathedral", "Lighthouse", "Tower", "Museum", "Castle", "Opera House", "Library", "Palace"]
PEAKS = ["Karsa", "Tolvan", "Ebrin", "Moska", "Hallar", "Vintor", "Selka", "Duram", "Orvik", "Brenna"]
LANGUAGES = ["Norvish", "Keldic", "Valese", "Ostic", "Marran"]


def _country(r): return r.choice(SYLLABLES[0]) + r.choice(SYLLABLES[1])
def _city(r): return r.choice(CITY_PARTS[0]) + r.choice(CITY_PARTS[1])
def _book(r): return f"The {r.choice(ADJECTIVES)} {r.choice(NOUNS)}"
def _author(r): return f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
def _building(r): return f"the {r.choice(ADJECTIVES)} {r.choice(BUILDINGS)}"
def _peak(r): return f"Mount {r.choice(PEAKS)}"
def _year(r): return r.randint(1450, 1990)


# kind: (entity, answer value, questions, answers: (sharing the question's words, paraphrased),
#        near misses (the question's words or an answer-like value, no answer), other facts)
KINDS = {
    "capital": (_country, _city,
                ["what is the capital of {e}?", "what city is the capital of {e}?"],
                (["{a} is the capital of {e}.", "The capital of {e} is {a}, its largest city."],
                 ["The government of {e} sits in {a}.", "{e} is governed from {a}, its largest city.",
                  "{a}, the seat of {e}'s parliament, lies on the coast."]),
                ["Visitors to the capital of {e} often arrive by train from {c}.",
                 "{c} was the capital of {e} until {y}.", "The capital of {e} hosts a festival every summer.",
                 "{c} is the second largest city of {e}.", "{c} is the capital of {e2}."],
                ["{e} has a population of about {n} million people.", "The official language of {e} is {lang}.",
                 "{e} declared independence in {y}.", "{e} is bordered by {e2} to the north.",
                 "The national football team of {e} was founded in {y}."]),
    "author": (_book, _author,
               ["who wrote {e}?", "who is the author of {e}?"],
               (["{e} is a novel written by {a} in {y}.", "{e} was written by {a}."],
                ["{a} published {e} in {y} after years of work.", "{e} made {a} famous in {c}.",
                 "{a} finished {e} while living in {c}."]),
               ["{e} was written in a small house in {c}.", "{p} wrote a famous review of {e}.",
                "{e} was adapted into a film by the director {p}.", "{p} wrote {e2}, a novel set in {c}.",
                "The author of {e} was born in {c}."],
               ["{e} tells the story of a family in {c}.", "{e} sold over {n} million copies.",
                "The first edition of {e} had {n} chapters.", "{e} was translated into {lang} in {y}.",
                "Critics called {e} the best book of {y}."]),
    "built": (_building, _year,
              ["when was {e} built?", "what year was {e} built?"],
              (["{E} was built in {a}.", "Construction of {e} was completed in {a}."],
               ["{E} opened to the public in {a}, after {n} years of work.", "Workers finished {e} in {a}.",
                "{E} has stood in {c} since {a}."]),
              ["{E} was rebuilt in {y} after a fire.", "A copy of {e} was built in {c} in {y}.",
               "{E} was built by the architect {p}.", "{E2} was built in {y}.",
               "Building {e} cost {n} million coins."],
              ["{E} stands in the old town of {c}.", "{E} is {n}0 metres tall.",
               "{E} attracts about {n} thousand visitors each year.", "{E} is owned by the city of {c}.",
               "{E} appears on a stamp issued by {x}."]),
    "height": (_peak, lambda r: r.randint(1200, 8400),
               ["how high is {e}?", "how tall is {e}?"],
               (["{e} rises {a} metres above sea level.", "{e} is {a} metres high."],
                ["At {a} metres, {e} is the highest peak of {x}.", "The summit of {e} stands at {a} metres.",
                 "Climbers who reach the top of {e} stand {a} metres above the sea."]),
               ["The highest village on {e} lies at {n}00 metres.", "{e} is {n}0 kilometres from {c}.",
                "{e2} rises {a} metres above sea level.", "The snow line on {e} is at {n}00 metres.",
                "{e} is higher than any peak in {x}."],
               ["{e} was first climbed in {y}.", "{e} lies in the north of {x}.",
                "{e} is covered by snow for {n} months of the year.", "The village of {c} sits below {e}.",
                "{e} was named after the explorer {p}."]),
}
PARAPHRASED = 0.6  # share of answers that share few words with the question
NEAR_MISSES = (1, 3)  # wrong candidates that share the question's words, per question


def _sample_rows(rng: random.Random, split: str, n: int):
    """Whole questions (all their candidates) until at least n rows."""
    written, q = 0, 0
    while written < n:
        q += 1
        question, title, candidates = sample_question(rng)
        for sentence, label in candidates:
            yield [f"{split}-Q{q}", question, title, sentence, label]
        written += len(candidates)


def sample_question(rng: random.Random) -> tuple[str, str, list[tuple[str, int]]]:
    """One question, its document title and 3-6 (sentence, label) candidates, in random order."""
    kind = rng.choice(list(KINDS))
    make, value, questions, (overlapping, paraphrased), near, others = KINDS[kind]
    entity = make(rng)
    other = entity
    while other == entity:
        other = make(rng)

    def fill(template):
        return template.format(e=entity, E=entity[0].upper() + entity[1:], e2=other, E2=other[0].upper() + other[1:],
                               a=value(rng), y=_year(rng), n=rng.randint(2, 60), c=_city(rng), p=_author(rng),
                               x=_country(rng), lang=rng.choice(LANGUAGES))

    n = rng.randint(3, 6)
    candidates = [(fill(t), 0) for t in rng.sample(near, rng.randint(*NEAR_MISSES))]
    candidates += [(fill(t), 0) for t in rng.sample(others, n - len(candidates))]
    if rng.random() < ANSWERED:
        answer = rng.choice(paraphrased if rng.random() < PARAPHRASED else overlapping)
        candidates[-1] = (fill(answer), 0 if rng.random() < LABEL_NOISE else 1)
    if rng.random() < LABEL_NOISE * ANSWERED:  # label noise: a wrong candidate marked correct
        k = rng.randrange(len(candidates) - 1)
        candidates[k] = (candidates[k][0], 1)
    rng.shuffle(candidates)
    title = entity[4:] if entity.startswith("the ") else entity
    return rng.choice(questions).format(e=entity), title, candidates
