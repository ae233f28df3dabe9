"""Tiny random models of the four families the studies name, built at test time (never committed)
and served under their hub ids from an offline Hugging Face cache.

Each has its hub model's architecture and file set, so `model=csebuetnlp/banglabert` goes through
the loading code a user with a hub hits (tokenizer class and config resolution, the task head on
a base checkpoint):

- csebuetnlp/banglabert, csebuetnlp/banglishbert: ELECTRA discriminators (ElectraForPreTraining
  weights), a cased WordPiece vocab.txt and tokenizer_config.json, no tokenizer.json (transformers
  builds the tokenizer from vocab.txt, as it does for the hub's files);
- xlm-roberta-base: XLMRobertaForMaskedLM, a Unigram tokenizer.json with Metaspace pre-tokenization,
  <s> <pad> </s> <unk> as ids 0-3 and <mask> last, no token_type_ids;
- bert-base-multilingual-cased: BertForPreTraining, cased WordPiece (vocab.txt and tokenizer.json).

The vocabularies are trained with the `tokenizers` library on the pipeline's sample texts
(normalized, as the real models were pretrained on normalized text); the curly and straight
quotes are in every alphabet, so a test can tell normalized input from raw input.

The cache is laid out as huggingface_hub lays it out (file_download.py): REPO/blobs/HASH,
REPO/snapshots/COMMIT/FILE -> ../../blobs/HASH, REPO/refs/main holding COMMIT, REPO being
models--OWNER--NAME. Point HF_HUB_CACHE at it and set HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForPreTraining,
    ElectraConfig,
    ElectraForPreTraining,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
)

BANGLABERT = "csebuetnlp/banglabert"
BANGLISHBERT = "csebuetnlp/banglishbert"
XLMR = "xlm-roberta-base"
MBERT = "bert-base-multilingual-cased"
FAMILIES = (BANGLABERT, BANGLISHBERT, XLMR, MBERT)
MODEL_TYPE = {BANGLABERT: "electra", BANGLISHBERT: "electra", XLMR: "xlm-roberta", MBERT: "bert"}

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
NARROW = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
QUOTES = ["\u201c", "\u201d", '"']  # the normalizer turns curly quotes into straight ones
VOCAB = {BANGLABERT: 1500, BANGLISHBERT: 1200, XLMR: 1500, MBERT: 1800}  # different sizes, different vocabs
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
UNIGRAM_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0-3, as XLM-R's (its tokenizer class assumes unk=3)


def build_hub_cache(cache: Path, texts: list[str]) -> dict[str, Path]:
    """Every family under its hub id in `cache` (an HF_HUB_CACHE folder): hub id -> snapshot."""
    snapshots = {}
    for repo_id in FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            write_model(repo_id, texts, Path(tmp), SIZES)
            snapshots[repo_id] = publish(cache, repo_id, Path(tmp))
    return snapshots


def write_model(repo_id: str, texts: list[str], folder: Path, sizes: dict) -> None:
    """The family's files (random weights of `sizes`) into `folder`, as the hub ships them."""
    if MODEL_TYPE[repo_id] == "xlm-roberta":
        tok = unigram(texts, VOCAB[repo_id])
        tok.save(str(folder / "tokenizer.json"))
        write_json(folder / "tokenizer_config.json", {
            "tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, "bos_token": "<s>",
            "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>",
            "pad_token": "<pad>", "mask_token": "<mask>"})
    else:
        tok = wordpiece(texts, VOCAB[repo_id])
        if MODEL_TYPE[repo_id] == "bert":
            tok.save(str(folder / "tokenizer.json"))  # mBERT's hub repo has one; BanglaBERT's has vocab.txt only
        vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
        (folder / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab), encoding="utf-8")
        write_json(folder / "tokenizer_config.json", {
            "tokenizer_class": "ElectraTokenizer" if MODEL_TYPE[repo_id] == "electra" else "BertTokenizer",
            "do_lower_case": False, "strip_accents": False, "tokenize_chinese_chars": False, "model_max_length": 512})
        write_json(folder / "special_tokens_map.json", {
            "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
            "mask_token": "[MASK]"})
    write_weights(repo_id, tok.get_vocab_size(), folder, sizes)


def write_weights(repo_id: str, vocab_size: int, folder: Path, sizes: dict) -> None:
    """Random weights and config.json of the family's pretraining architecture."""
    torch.manual_seed(0)
    if MODEL_TYPE[repo_id] == "xlm-roberta":  # positions start after the padding index, as RoBERTa's
        config = XLMRobertaConfig(vocab_size=vocab_size, max_position_embeddings=514, type_vocab_size=1,
                                  pad_token_id=1, bos_token_id=0, eos_token_id=2, **sizes)
        XLMRobertaForMaskedLM(config).save_pretrained(folder)
        return
    common = dict(vocab_size=vocab_size, max_position_embeddings=512, pad_token_id=0, **sizes)
    if MODEL_TYPE[repo_id] == "electra":
        ElectraForPreTraining(ElectraConfig(embedding_size=sizes["hidden_size"], **common)).save_pretrained(folder)
    else:
        BertForPreTraining(BertConfig(**common)).save_pretrained(folder)


def write_narrow(repo_id: str, snapshot: Path, folder: Path) -> Path:
    """A narrower model of the family (NARROW sizes) with the snapshot's tokenizer, as a local
    directory: a student whose hidden states are narrower than the teacher's."""
    folder.mkdir(parents=True)
    for path in snapshot.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copyfile(path, folder / path.name)
    vocab_size = json.loads((snapshot / "config.json").read_text())["vocab_size"]
    write_weights(repo_id, vocab_size, folder, NARROW)
    return folder


def wordpiece(texts: list[str], vocab_size: int) -> Tokenizer:
    """A cased WordPiece (BERT's pipeline without lower-casing or accent stripping)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False, clean_text=True,
                                                handle_chinese_chars=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=WORDPIECE_SPECIALS, initial_alphabet=QUOTES, show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def unigram(texts: list[str], vocab_size: int) -> Tokenizer:
    """A sentencepiece-style Unigram with Metaspace pre-tokenization and XLM-R's special tokens."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.train_from_iterator(texts, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=UNIGRAM_SPECIALS, unk_token="<unk>", initial_alphabet=QUOTES,
        show_progress=False))
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return tok


def publish(cache: Path, repo_id: str, folder: Path) -> Path:
    """The files of `folder` as `repo_id`'s main revision in a hub cache; returns the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    blobs = {name: blob_name(name, data) for name, data in files.items()}
    commit = hashlib.sha1("".join(f"{n} {b}\n" for n, b in blobs.items()).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (repo / "blobs" / blobs[name]).write_bytes(data)
        os.symlink(Path("..", "..", "blobs", blobs[name]), snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)  # no newline: the hub client writes the bare hash
    return snapshot


def blob_name(name: str, data: bytes) -> str:
    """The hub's blob name: sha256 for LFS files (weights), the git blob sha1 for the rest."""
    if name.endswith((".safetensors", ".bin")):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False), encoding="utf-8")
