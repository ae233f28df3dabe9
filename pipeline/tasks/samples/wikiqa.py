"""The WikiQA sample set (TSV in the hub schema: question_id, question, document_title, answer, label).

Invented entities (syllables and word lists written for this project), templated facts, 3-6
candidates per question and about 30% of the questions without an answer. What makes it
WikiQA-like: the answer is often a paraphrase that shares few words with the question ("The
government of Norvia sits in Ashford."), while wrong candidates share them ("Visitors to the
capital of Norvia arrive from Saltford.", "Ashford was the capital of Norvia until 1820.",
"Saltmouth is the capital of Keldia."): word overlap is a weak cue; the relation decides.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from pipeline.tasks.samples.common import TSV, write_table

SAMPLE_HEADER = ["question_id", "question", "document_title", "answer", "label"]  # the hub's columns
SAMPLE_SIZES = {"train": 1200, "dev": 300, "test": 600}  # candidate pairs per split
ANSWERED = 0.7  # fraction of questions with a correct candidate (~16% of the pairs)
LABEL_NOISE = 0.05
"""Share of the correct candidates labelled 0; as many wrong candidates are labelled 1 (in expectation).
Flipping 5% of all pairs instead would make a third of the rare positive labels noise."""

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


def _country(r: random.Random) -> str: return r.choice(SYLLABLES[0]) + r.choice(SYLLABLES[1])
def _city(r: random.Random) -> str: return r.choice(CITY_PARTS[0]) + r.choice(CITY_PARTS[1])
def _book(r: random.Random) -> str: return f"The {r.choice(ADJECTIVES)} {r.choice(NOUNS)}"
def _author(r: random.Random) -> str: return f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
def _building(r: random.Random) -> str: return f"the {r.choice(ADJECTIVES)} {r.choice(BUILDINGS)}"
def _peak(r: random.Random) -> str: return f"Mount {r.choice(PEAKS)}"
def _year(r: random.Random) -> int: return r.randint(1450, 1990)


# kind: (entity, answer value, questions, answers: (sharing the question's words, paraphrased),
#        near misses (the question's words or an answer-like value, no answer), other facts)
QUESTION_FORMS = {
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


def _sample_rows(rng: random.Random, split: str, n: int) -> Iterator[list]:
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
    kind = rng.choice(list(QUESTION_FORMS))
    make, value, questions, (overlapping, paraphrased), near, others = QUESTION_FORMS[kind]
    entity = make(rng)
    other = entity
    while other == entity:
        other = make(rng)

    def fill(template: str) -> str:
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


def write(directory: Path) -> dict[str, Path]:
    """train/dev/test.tsv in `directory`, whole questions (all their candidates) per split."""
    return {split: write_table(directory / f"{split}.tsv", SAMPLE_HEADER,
                               _sample_rows(random.Random(2000 + offset), split, n), **TSV)
            for offset, (split, n) in enumerate(SAMPLE_SIZES.items())}
