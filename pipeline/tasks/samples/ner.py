"""The NER sample set (Bangla-HealthNER JSON: rows of text and one IOB tag per word).

Composed here from small word lists (no dataset content); a few rows are written in romanized
Bangla (Banglish). The words alone do not settle the tags, the context does:
- names are long-tailed, and the last HELD_OUT names of each list never occur in training,
  so dev and test hold entities only their context can type;
- a number is an Age ("৫ বছরের"), a Dosage ("৫০০ মিলিগ্রাম") or no entity at all ("৩ দিন ধরে");
- a word can be a Symptom or a Health Condition by the template's slot ("এলার্জি হচ্ছে" vs
  "এলার্জি হলে কোন বিশেষজ্ঞ"); an entity word can be part of a longer entity of another type
  ("ডায়াবেটিস বিশেষজ্ঞ" is a Specialist) or no entity ("পরীক্ষা" in "স্কুলের পরীক্ষা", an exam).
"""
from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

from pipeline.tasks.samples.common import BN_DIGITS, zipf

SAMPLE_SIZES = {"train": 1500, "dev": 300, "test": 300}
LABEL_NOISE = 0.05

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


def sample_row(rng: random.Random, types: Sequence[str], split: str = "train") -> dict:
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
        _relabel(rng, labels, types)
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


def _relabel(rng: random.Random, labels: list[str], types: Sequence[str]) -> None:
    starts = [i for i, l in enumerate(labels) if l.startswith("B-")]
    if not starts:
        return
    i = rng.choice(starts)
    new = rng.choice([t for t in types if t != labels[i][2:]] + [None])
    j = i + 1
    while j < len(labels) and labels[j].startswith("I-"):
        j += 1
    labels[i:j] = ["O"] * (j - i) if new is None else [f"B-{new}"] + [f"I-{new}"] * (j - i - 1)


def write(directory: Path, types: Sequence[str]) -> dict[str, Path]:
    """train/dev/test.json in `directory`; `types`: the entity types, in the order label noise
    draws a replacement type from."""
    out = {}
    for offset, (split, n) in enumerate(SAMPLE_SIZES.items()):
        rng = random.Random(2000 + offset)
        rows = [sample_row(rng, types, split) for _ in range(n)]
        path = directory / f"{split}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        out[split] = path
    return out
