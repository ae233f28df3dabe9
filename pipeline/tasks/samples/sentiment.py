"""The sentiment sample set (BLP-2023 TSV: id, text, label): comments composed by a small grammar.

Polar sentences: one opinion, a negated opposite ("not bad"), a contrast whose main clause
decides ("the price is high, but the taste is great"), a concession ("although ..."), another
person's opinion that the writer contradicts, or a recommendation. Neutral sentences: facts,
and sentences that mention opinion words without holding an opinion (questions, hearsay,
conditions, a balanced "so-so"). So an opinion word, a negation or a contrast word is never
enough alone: where it sits decides.
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline.tasks.samples.common import BN_DIGITS, TSV, noisy, write_table, zipf

SAMPLE_SIZES = {"train": 2400, "dev": 400, "test": 400}
LABEL_NOISE = 0.05

SUBJECTS = ["খাবার", "সিনেমা", "বই", "ফোন", "হোটেল", "সেবা", "গান", "দোকান", "রেস্তোরাঁ", "নাটক",
            "খেলা", "ক্যামেরা", "ডেলিভারি", "অ্যাপ", "বাস", "ট্রেন", "ল্যাপটপ", "জামা", "হাসপাতাল", "পার্ক"]
ASPECTS = ["দাম", "মান", "স্বাদ", "ব্যবহার", "পরিবেশ", "ডিজাইন", "সার্ভিস", "গল্প", "অভিনয়", "ব্যাটারি",
           "প্যাকেজিং", "আচরণ", "গতি", "সাউন্ড"]
POSITIVE = ["ভালো", "চমৎকার", "দারুণ", "সুন্দর", "অসাধারণ", "মজার", "সেরা", "প্রশংসনীয়", "উপভোগ্য",
            "আরামদায়ক", "মনোমুগ্ধকর", "নিখুঁত", "সন্তোষজনক", "মানসম্মত", "চমকপ্রদ", "জমজমাট"]
NEGATIVE = ["খারাপ", "বাজে", "জঘন্য", "হতাশাজনক", "বিরক্তিকর", "নিম্নমানের", "ভয়ংকর", "অসহ্য", "ফালতু",
            "নোংরা", "অখাদ্য", "ঝামেলার", "ধীরগতির", "ত্রুটিপূর্ণ", "অপ্রীতিকর", "বেমানান"]
INTENSIFIERS = ["খুব", "সত্যিই", "একদম", "বেশ", "অনেক", "", "", ""]
OPENERS = ["", "", "", "আমার মনে হয়", "সত্যি বলতে", "গতকাল দেখলাম", "আজ", "ভাই,"]
ENDINGS = ["।", "।", "!", "", " ।"]
BUT = ["কিন্তু", "তবে", "তবুও"]
HEARSAY = ["বন্ধুরা বলেছিল", "সবাই বলছিল", "রিভিউতে পড়েছিলাম", "শুনেছিলাম"]
RECOMMEND = {"Positive": ["আবার কিনব", "সবাইকে নিতে বলব", "আবার যাব", "টাকা উসুল"],
             "Negative": ["আর কখনো কিনব না", "কাউকে নিতে বলব না", "আর যাব না", "টাকাটাই নষ্ট"]}
LIKING = {"Positive": "পছন্দ হয়েছে", "Negative": "পছন্দ হয়নি"}
FEELING = {"Positive": "খুশি", "Negative": "হতাশ"}
OPPOSITE = {"Positive": "Negative", "Negative": "Positive"}
# plain opinions are the majority: a small model trained from scratch must find the polarity
# words within two epochs (with fewer it stays on a plateau, predicting one polarity for all)
POLAR_FORMS = {"plain": 0.6, "contrast": 0.15, "concession": 0.08, "hearsay": 0.07, "recommend": 0.05, "never": 0.05}
NEUTRAL_FORMS = {"fact": 0.3, "question": 0.2, "hearsay": 0.2, "condition": 0.15, "balanced": 0.15}
NEGATED = 0.15
"""Share of opinions said as the negated opposite ("not bad")."""


def _adjective(rng: random.Random, polarity: str) -> str:
    return zipf(rng, POSITIVE if polarity == "Positive" else NEGATIVE, 1.5)


def _opinion(rng: random.Random, topic: str, polarity: str) -> str:
    """`topic` holds `polarity`: an adjective, a liking or a feeling, or the negated opposite
    adjective ("not bad")."""
    if rng.random() < NEGATED:
        softener = rng.choice(["", "মোটেও", "একটুও"])
        adjective = _adjective(rng, OPPOSITE[polarity])
        return f"{topic} {softener} {adjective} {rng.choice(['না', 'ছিল না'])}"
    inten = rng.choice(INTENSIFIERS)
    return rng.choice([
        f"{topic} {inten} {_adjective(rng, polarity)} {rng.choice(['', 'ছিল', 'লেগেছে'])}",
        f"{topic} আমার {inten} {LIKING[polarity]}",
        f"{topic} নিয়ে আমি {inten} {FEELING[polarity]}",
    ])


def _polar(rng: random.Random, label: str) -> str:
    subj, other = f"{rng.choice(SUBJECTS)}টা", OPPOSITE[label]
    first, second = rng.sample(ASPECTS, 2)
    form = rng.choices(list(POLAR_FORMS), weights=list(POLAR_FORMS.values()))[0]
    if form == "plain":
        extra = f", {rng.choice(RECOMMEND[label])}" if rng.random() < 0.4 else ""
        return _opinion(rng, subj, label) + extra
    if form == "contrast":  # the clause after "but" decides
        return f"{_opinion(rng, first, other)}, {rng.choice(BUT)} {_opinion(rng, second, label)}"
    if form == "concession":  # the clause that is not conceded decides, whichever comes first
        conceded = f"যদিও {_opinion(rng, first, other)}"
        main = _opinion(rng, subj if rng.random() < 0.5 else second, label)
        return f"{conceded}, {main}" if rng.random() < 0.6 else f"{main}, {conceded}"
    if form == "hearsay":  # someone else's opinion, then the writer's own
        return f"{rng.choice(HEARSAY)} {subj} {_adjective(rng, other)}, কিন্তু আমার কাছে {_adjective(rng, label)} লেগেছে"
    if form == "recommend":
        return f"{subj} {rng.choice(['নিয়ে', 'দেখে'])} {rng.choice(RECOMMEND[label])}"
    return f"এত {_adjective(rng, label)} {rng.choice(SUBJECTS)} আগে কখনো দেখিনি"


def _neutral(rng: random.Random) -> str:
    subj, polarity = rng.choice(SUBJECTS), rng.choice(list(OPPOSITE))
    price = str(rng.randint(20, 5000)).translate(BN_DIGITS)
    form = rng.choices(list(NEUTRAL_FORMS), weights=list(NEUTRAL_FORMS.values()))[0]
    if form == "fact":
        return rng.choice([f"{subj} আজ বিকেলে পাওয়া যাবে", f"{subj}টা গতকাল কেনা হয়েছে",
                           f"{subj} সম্পর্কে আরও তথ্য জানতে চাই", f"{subj}টার দাম {price} টাকা",
                           f"আগামীকাল {subj} নিয়ে আলোচনা হবে", f"{subj}টা আমি এখনও দেখিনি"])
    if form == "question":  # an opinion word asked about, not held
        return rng.choice([f"{subj}টা কি {_adjective(rng, polarity)}?",
                           f"{subj}টা {_adjective(rng, 'Positive')} নাকি {_adjective(rng, 'Negative')}, কেউ জানেন?",
                           f"কেউ কি বলতে পারেন {subj}টা {_adjective(rng, polarity)} কিনা?"])
    if form == "hearsay":  # someone else's opinion, and the writer has none yet
        return f"{rng.choice(HEARSAY)} {subj}টা {_adjective(rng, polarity)}, আমি এখনও দেখিনি"
    if form == "condition":
        return f"{subj}টা {_adjective(rng, 'Positive')} হলে {rng.choice(['কিনব', 'যাব', 'জানাব'])}"
    first, second = rng.sample(ASPECTS, 2)
    return f"{first} {_adjective(rng, polarity)}, {second} {_adjective(rng, OPPOSITE[polarity])}, সব মিলিয়ে মোটামুটি"


def sentiment_sentence(rng: random.Random, label: str) -> str:
    """One comment whose sentiment is `label` (Positive, Negative or Neutral)."""
    body = _neutral(rng) if label == "Neutral" else _polar(rng, label)
    ending = "" if body.endswith("?") else rng.choice(ENDINGS)
    text = " ".join(f"{rng.choice(OPENERS)} {body}{ending}".split())
    return text if rng.random() > 0.1 else text.replace(" ", "  ", 1)  # some messy spacing


def write(directory: Path, columns: Sequence[str], labels: Sequence[str]) -> dict[str, Path]:
    """train/dev/test.tsv in `directory`: a header of `columns` (id, text, label), then rows whose
    label is drawn uniformly from `labels` (Positive, Negative, Neutral) and flipped at LABEL_NOISE."""
    return {split: write_table(directory / f"{split}.tsv", columns,
                               _sample_rows(random.Random(1000 + offset), split, n, labels), **TSV)
            for offset, (split, n) in enumerate(SAMPLE_SIZES.items())}


def _sample_rows(rng: random.Random, split: str, n: int, labels: Sequence[str]) -> Iterator[list[str]]:
    for i in range(n):
        label = rng.choice(labels)
        text = sentiment_sentence(rng, label)
        yield [f"{split}-{i:05d}", text, noisy(rng, label, labels, LABEL_NOISE)]
