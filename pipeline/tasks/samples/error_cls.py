"""The error_cls sample set (BaTEClaCor CSV: Comment, Error, Category).

Composed from small word lists (no dataset content): "pronoun time object verb".
Grammatical = the verb agrees with another person, or the subject is in the genitive case;
Spelling = a misspelled word from the list below; Code Switching = an English word; Multiple
Errors = two of these. A fifth of the comments are written in romanized Bangla (Banglish):
there Latin script is no error at all, only an English word among the Banglish ones is, so
the script is a weak cue and the model has to know the words.
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.tasks.samples.common import noisy, write_table

SAMPLE_SIZES = {"train": 1500, "dev": 300, "test": 300}
LABEL_NOISE = 0.05
CATEGORY_SHARES = {"Correct": 0.3, "Grammatical": 0.2, "Spelling": 0.2, "Code Switching": 0.15,
                   "Multiple Errors": 0.15}
"""How often each category is drawn, before label noise."""

PRONOUNS = {"1": ["আমি", "আমরা"], "2": ["তুমি", "তোমরা"], "3": ["সে", "তারা", "ও"], "hon": ["আপনি", "আপনারা"]}
GENITIVE = {"আমি": "আমার", "আমরা": "আমাদের", "তুমি": "তোমার", "তোমরা": "তোমাদের", "সে": "তার", "তারা": "তাদের",
            "ও": "ওর", "আপনি": "আপনার", "আপনারা": "আপনাদের"}
VERBS = [  # (objects, present-tense form per person)
    (["বাজারে", "স্কুলে", "অফিসে", "গ্রামে", "মাঠে"], {"1": "যাই", "2": "যাও", "3": "যায়", "hon": "যান"}),
    (["ভাত", "মাছ", "ফল", "রুটি", "মিষ্টি"], {"1": "খাই", "2": "খাও", "3": "খায়", "hon": "খান"}),
    (["বই", "পত্রিকা", "গল্প", "কবিতা"], {"1": "পড়ি", "2": "পড়ো", "3": "পড়ে", "hon": "পড়েন"}),
    (["সিনেমা", "নাটক", "খবর"], {"1": "দেখি", "2": "দেখো", "3": "দেখে", "hon": "দেখেন"}),
    (["কাজ", "রান্না", "ব্যায়াম"], {"1": "করি", "2": "করো", "3": "করে", "hon": "করেন"}),
    (["চিঠি", "ডায়েরি"], {"1": "লিখি", "2": "লেখো", "3": "লেখে", "hon": "লেখেন"}),
]
TIMES = ["প্রতিদিন", "সকালে", "বিকেলে", "রাতে", "সবসময়", "আজকাল", "মাঝেমধ্যে"]
OPENERS = ["", "", "", "ভাই,", "আসলে", "সত্যি বলতে,"]
ENDINGS = ["।", "।", "", "!"]
MISSPELLED = {
    "প্রতিদিন": "প্রতিদীন", "সকালে": "শকালে", "বিকেলে": "বীকেলে", "রাতে": "রাথে", "সবসময়": "সবসময",
    "আজকাল": "আজকল", "মাঝেমধ্যে": "মাজেমধ্যে", "বাজারে": "বাজাড়ে", "স্কুলে": "স্কূলে", "অফিসে": "অফিছে",
    "গ্রামে": "গ্রমে", "মাঠে": "মাটে", "ভাত": "ভাথ", "মাছ": "মাচ", "ফল": "ফোল", "রুটি": "রুটী",
    "মিষ্টি": "মিস্টি", "বই": "বোই", "পত্রিকা": "পত্রীকা", "গল্প": "গলপ", "কবিতা": "কবীতা", "সিনেমা": "সিনামা",
    "নাটক": "নাটোক", "খবর": "খবোর", "কাজ": "কায", "রান্না": "রান্যা", "ব্যায়াম": "ব্যয়াম", "চিঠি": "চিঠী",
    "ডায়েরি": "ডাইরী",
}
ENGLISH = {
    "প্রতিদিন": "daily", "সকালে": "morning e", "রাতে": "night e", "সবসময়": "always", "বাজারে": "market e",
    "স্কুলে": "school e", "অফিসে": "office e", "বই": "book", "গল্প": "story", "সিনেমা": "movie", "খবর": "news",
    "কাজ": "work", "ব্যায়াম": "exercise", "চিঠি": "letter",
}
FILLERS = ["actually", "really", "basically", "honestly", "anyway"]  # English words code-switched in
BANGLISH = {  # romanized forms of the words above (the spelling most comments use)
    "আমি": "ami", "আমরা": "amra", "তুমি": "tumi", "তোমরা": "tomra", "সে": "she", "তারা": "tara", "ও": "o",
    "আপনি": "apni", "আপনারা": "apnara", "আমার": "amar", "আমাদের": "amader", "তোমার": "tomar", "তোমাদের": "tomader",
    "তার": "tar", "তাদের": "tader", "ওর": "or", "আপনার": "apnar", "আপনাদের": "apnader",
    "প্রতিদিন": "protidin", "সকালে": "sokale", "বিকেলে": "bikele", "রাতে": "rate", "সবসময়": "sobsomoy",
    "আজকাল": "ajkal", "মাঝেমধ্যে": "majhe moddhe", "বাজারে": "bazare", "স্কুলে": "iskule", "অফিসে": "ofise",
    "গ্রামে": "grame", "মাঠে": "mathe", "ভাত": "bhat", "মাছ": "mach", "ফল": "fol", "রুটি": "ruti", "মিষ্টি": "mishti",
    "বই": "boi", "পত্রিকা": "potrika", "গল্প": "golpo", "কবিতা": "kobita", "সিনেমা": "cinema", "নাটক": "natok",
    "খবর": "khobor", "কাজ": "kaj", "রান্না": "ranna", "ব্যায়াম": "bayam", "চিঠি": "chithi", "ডায়েরি": "diary",
    "যাই": "jai", "যাও": "jao", "যায়": "jay", "যান": "jan", "খাই": "khai", "খাও": "khao", "খায়": "khay",
    "খান": "khan", "পড়ি": "pori", "পড়ো": "poro", "পড়ে": "pore", "পড়েন": "poren", "দেখি": "dekhi",
    "দেখো": "dekho", "দেখে": "dekhe", "দেখেন": "dekhen", "করি": "kori", "করো": "koro", "করে": "kore",
    "করেন": "koren", "লিখি": "likhi", "লেখো": "lekho", "লেখে": "lekhe", "লেখেন": "lekhen",
    "ভাই,": "bhai,", "আসলে": "asole", "সত্যি বলতে,": "sotti bolte,",
}
BANGLISH_SHARE = 0.2
"""Comments written in romanized Bangla; never Spelling (romanized Bangla has no one spelling)."""


def sample_comment(rng: random.Random, category: str) -> str:
    person = rng.choice(list(PRONOUNS))
    objects, forms = rng.choice(VERBS)
    words = [rng.choice(PRONOUNS[person]), rng.choice(TIMES), rng.choice(objects), forms[person]]
    kinds = {"Grammatical": ["g"], "Spelling": ["s"], "Code Switching": ["c"],
             "Multiple Errors": rng.sample(["g", "s", "c"], 2), "Correct": []}[category]
    banglish = "s" not in kinds and rng.random() < BANGLISH_SHARE
    if "g" in kinds and rng.random() < 0.5:  # a verb form of another person, never the right one
        words[3] = rng.choice([f for p, f in forms.items() if f != forms[person]])
    elif "g" in kinds:
        words[0] = GENITIVE[words[0]]
    if "s" in kinds:
        i = rng.choice([1, 2])
        words[i] = MISSPELLED[words[i]]
    words = [rng.choice(OPENERS), *words]
    if banglish:
        words = [BANGLISH.get(w, w) for w in words]
    if "c" in kinds:
        switchable = [i for i in (2, 3) if words[i] in ENGLISH or BANGLISH_OF.get(words[i]) in ENGLISH]
        if switchable and rng.random() < 0.7:
            i = rng.choice(switchable)
            words[i] = ENGLISH[BANGLISH_OF.get(words[i], words[i])]
        else:
            words.insert(rng.randrange(1, len(words) + 1), rng.choice(FILLERS))
    return " ".join(words).strip() + rng.choice(["", ".", "!"] if banglish else ENDINGS)


BANGLISH_OF = {roman: bangla for bangla, roman in BANGLISH.items()}
"""Romanized word -> its Bangla-script word."""


def write(directory: Path, columns: Sequence[str], labels: Sequence[str]) -> dict[str, Path]:
    """train/dev/test.csv in `directory`: a header of `columns` (Comment, Error, Category), then
    comments of the categories `labels` ("Correct" and the four errors) at CATEGORY_SHARES."""
    return {split: write_table(directory / f"{split}.csv", columns,
                               _sample_rows(random.Random(3000 + offset), n, labels))
            for offset, (split, n) in enumerate(SAMPLE_SIZES.items())}


def _sample_rows(rng: random.Random, n: int, labels: Sequence[str]) -> Iterator[list]:
    for _ in range(n):
        category = rng.choices(labels, weights=[CATEGORY_SHARES[l] for l in labels])[0]
        comment = sample_comment(rng, category)
        category = noisy(rng, category, labels, LABEL_NOISE)
        # noise flips the category; Error follows it so the row stays consistent
        yield [comment, int(category != "Correct"), "" if category == "Correct" else category]
