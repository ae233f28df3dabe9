"""The QA sample set (squad_bn JSON Lines: id, title, context, question, answers).

Short paragraphs of templated facts about one person and a friend; questions ask for one fact
(a city, a job, a fruit, or a number in Bangla digits). Every paragraph holds distractors of
the answer's own kind: the city a person lives in and the city they were born in, their age
and their birth year, and the friend's city and job. The question shares its words with the
sentence of the answer ("... কোন শহরে থাকেন?" / "... ঢাকা শহরে থাকেন।"), so a model that reads
the words around a candidate finds it; one that only learned what a city looks like does not.
Some questions ask for a fact that is not there (unanswerable), some paragraphs carry filler
sentences so they need several windows, some have messy spacing (the normalizer moves the
offsets), and a few golds point at the wrong fact (label noise).
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from pipeline.tasks.samples.common import BN_DIGITS

SAMPLE_SIZES = {"train": 1200, "dev": 200, "test": 200}  # questions

NAMES = ["রহিম", "করিম", "সুমন", "রাকিব", "তানভীর", "নাসরিন", "ফারহানা", "সাবিনা", "জয়া", "মিতু",
         "আরিফ", "শাকিল", "রুমানা", "পলাশ", "দীপা", "অনিক", "তৃষা", "মাহমুদ", "সাদিয়া", "ইমরান"]
CITIES = ["ঢাকা", "চট্টগ্রাম", "খুলনা", "রাজশাহী", "সিলেট", "বরিশাল", "রংপুর", "ময়মনসিংহ", "কুমিল্লা", "যশোর"]
JOBS = ["শিক্ষক", "ডাক্তার", "প্রকৌশলী", "কৃষক", "লেখক", "গায়ক", "ব্যবসায়ী", "সাংবাদিক", "চিত্রশিল্পী", "দর্জি"]
FRUITS = ["আম", "কাঁঠাল", "লিচু", "কলা", "পেয়ারা", "আনারস", "জাম", "তরমুজ"]
FILLER = ["সেখানে প্রতি সপ্তাহে একটি বড় হাট বসে।", "শীতকালে এই এলাকায় অনেক কুয়াশা পড়ে।",
          "নদীর পাশে একটি পুরনো মসজিদ আছে।", "স্থানীয় বাজারে সবজি বেশ সস্তা।", "গ্রীষ্মে এখানে প্রচণ্ড গরম পড়ে।",
          "এলাকার মানুষ খুব অতিথিপরায়ণ।", "বর্ষায় রাস্তাগুলো কাদায় ভরে যায়।", "বিকেলে ছেলেরা মাঠে ফুটবল খেলে।",
          "গ্রামের স্কুলটি অনেক পুরনো।", "সন্ধ্যায় চায়ের দোকানে ভিড় জমে।", "পাশের পুকুরে অনেক মাছ আছে।",
          "এখানকার মিষ্টি সারা দেশে বিখ্যাত।"]


def _bn_number(low: int, high: int) -> Callable[[random.Random], str]:
    return lambda r: str(r.randint(low, high)).translate(BN_DIGITS)


# attribute: (fact templates split around the value, question templates, value maker)
FACTS = {
    "city": ([("{n} ", " শহরে থাকেন।"), ("{n} এখন থাকেন ", " শহরে।")],
             ["{n} কোন শহরে থাকেন?", "{n} এখন কোথায় থাকেন?"], lambda r: r.choice(CITIES)),
    "birthplace": ([("{n}-এর জন্ম ", " শহরে।"), ("{n} জন্মেছেন ", " শহরে।")],
                   ["{n}-এর জন্ম কোন শহরে?", "{n} কোন শহরে জন্মেছেন?"], lambda r: r.choice(CITIES)),
    "age": ([("{n}-এর বয়স ", " বছর।")], ["{n}-এর বয়স কত?", "{n}-এর বয়স কত বছর?"], _bn_number(18, 80)),
    "year": ([("{n} ", " সালে জন্মগ্রহণ করেন।")], ["{n} কত সালে জন্মগ্রহণ করেন?", "{n} কোন সালে জন্মগ্রহণ করেন?"],
             _bn_number(1950, 2005)),
    "job": ([("{n} পেশায় একজন ", "।"), ("{n} একজন ", " হিসেবে কাজ করেন।")],
            ["{n}-এর পেশা কী?", "{n} কী কাজ করেন?"], lambda r: r.choice(JOBS)),
    "fruit": ([("{n}-এর প্রিয় ফল ", "।")], ["{n}-এর প্রিয় ফল কী?", "{n} কোন ফল সবচেয়ে ভালোবাসেন?"],
              lambda r: r.choice(FRUITS)),
}
FRIEND_FACTS = ("city", "job", "age")
"""What a paragraph may say about the friend too: a distractor of the same kind."""
UNANSWERABLE, LONG, MESSY, WRONG_GOLD, ABOUT_FRIEND = 0.15, 0.12, 0.1, 0.03, 0.2
FILLERS = (3, 6)  # filler sentences in a long paragraph: few enough that most features hold an answer


def _paragraph(rng: random.Random) -> tuple[str, str, bool, list[str], list[tuple]]:
    """(person, friend, messy, sentences, facts): facts are (person, attribute, value, sentence
    index, offset of the value in its sentence)."""
    person, friend = rng.sample(NAMES, 2)
    messy = rng.random() < MESSY
    stated = [(person, a) for a in rng.sample(list(FACTS), rng.randint(3, 5))]
    stated += [(friend, a) for a in rng.sample(FRIEND_FACTS, rng.randint(1, 2))]
    sentences, facts = [], []
    for who, attr in stated:
        before, after = rng.choice(FACTS[attr][0])
        before = before.format(n=who if who == person else f"{person}-এর বন্ধু {who}")
        if messy and rng.random() < 0.5:
            before = before.replace(" ", "  ", 1)
        value = FACTS[attr][2](rng)
        facts.append((who, attr, value, len(sentences), len(before)))
        sentences.append(before + value + after)
    order = list(range(len(sentences)))
    rng.shuffle(order)
    sentences = [sentences[i] for i in order]
    facts = [(*f[:3], order.index(f[3]), f[4]) for f in facts]
    if rng.random() < LONG:
        for filler in rng.sample(FILLER, rng.randint(*FILLERS)):
            at = rng.randint(0, len(sentences))
            sentences.insert(at, filler)
            facts = [f if f[3] < at else (*f[:3], f[3] + 1, f[4]) for f in facts]
    return person, friend, messy, sentences, facts


def sample_rows(rng: random.Random, n_questions: int) -> list[dict]:
    rows = []
    while len(rows) < n_questions:
        person, friend, messy, sentences, facts = _paragraph(rng)
        joiners = [rng.choice(["  ", " ", " \n"]) if messy else " " for _ in sentences]
        starts, context = [], ""
        for sentence, joiner in zip(sentences, joiners):
            starts.append(len(context))
            context += sentence + joiner
        context = context.rstrip()
        stated = {(p, a) for p, a, *_ in facts}
        for _ in range(rng.randint(1, 3)):
            who = friend if rng.random() < ABOUT_FRIEND else person
            if rng.random() < UNANSWERABLE:  # a fact that is not in the paragraph
                attr = rng.choice([a for a in FACTS if (who, a) not in stated])
                answer = None
            else:
                who, attr, value, sentence, offset = rng.choice([f for f in facts if f[0] == who] or facts)
                if rng.random() < WRONG_GOLD:
                    _, _, value, sentence, offset = rng.choice([f for f in facts if f[:2] != (who, attr)])
                answer = (value, starts[sentence] + offset)
            question = rng.choice(FACTS[attr][1]).format(n=who)
            rows.append({"title": person, "context": context, "question": question,
                         "answers": {"text": [answer[0]] if answer else [],
                                     "answer_start": [answer[1]] if answer else []}})
    return rows[:n_questions]


def write(directory: Path) -> dict[str, Path]:
    """train/dev/test.jsonl in `directory`, one question per line with its paragraph."""
    out = {}
    for offset, (split, n) in enumerate(SAMPLE_SIZES.items()):
        rng = random.Random(3000 + offset)
        path = directory / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i, row in enumerate(sample_rows(rng, n)):
                f.write(json.dumps({"id": f"{split}-{i:05d}", **row}, ensure_ascii=False) + "\n")
        out[split] = path
    return out
