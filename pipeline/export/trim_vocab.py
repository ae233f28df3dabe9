"""A vocabulary trimmed to the training data: `pipeline export DIR --trim-vocab`.

A multilingual encoder's embeddings are most of its weights (XLM-R base 69%, mBERT 52%,
all-MiniLM-L6-v2 52%), and a task in one language uses a small part of the vocabulary. The
trimmed model keeps the tokens the stage's training texts use plus every token the tokenizer
needs to spell any input (special tokens, every single-character token and, for WordPiece, its
`##` continuation; for Unigram, byte fallbacks); embedding rows and the tokenizer's vocabulary
are cut together, ids renumbered in their old order.

Why an input made only of kept tokens is tokenized the same: WordPiece matches the longest
vocabulary entry greedily, and a kept entry that was the longest among all is the longest among
those kept; Unigram's best segmentation over all entries, made of kept ones, is the best among
the kept. Other models (BPE's merges reach a token through pieces that may be cut) are refused.
`prove` checks it on the dev split rather than trusting it: every row without a trimmed token
must get the same tokens and the same predictions from the trimmed model.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pipeline.errors import UserError

SUPPORTED = ("WordPiece", "Unigram")
TEXT_BATCH = 1000


@dataclass(frozen=True)
class Trimmed:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    kept: torch.Tensor
    """The kept old ids, ascending: new id i is old id kept[i]."""
    old_to_new: torch.Tensor
    """Old id -> new id; a trimmed token -> the new id of the unknown token."""


def tokenizer_model(tokenizer: PreTrainedTokenizerFast) -> dict:
    """The fast tokenizer's `model` section of tokenizer.json; a one-line refusal for a model this
    trimming cannot keep exact (not a fast tokenizer, not WordPiece or Unigram)."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("export --trim-vocab: the tokenizer is not a fast (tokenizers) one: its vocabulary "
                        "cannot be cut")
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model["type"] not in SUPPORTED:
        raise UserError(f"export --trim-vocab: a {model['type']} tokenizer: only {' and '.join(SUPPORTED)} keep an "
                        "input of kept tokens tokenized the same once cut (a BPE token is reached through merges)")
    return model


def used_ids(tokenizer: PreTrainedTokenizerFast, texts: Iterable[str | tuple[str, str]]) -> set[int]:
    """Every id the tokenizer gives the texts (single texts or pairs), without truncation."""
    used: set[int] = set()
    batch: list = []
    for text in [*texts, None]:
        if text is not None:
            batch.append(text)
        if batch and (text is None or len(batch) == TEXT_BATCH):
            pairs = isinstance(batch[0], tuple)
            encoded = tokenizer([t[0] for t in batch], [t[1] for t in batch]) if pairs else tokenizer(batch)
            for ids in encoded["input_ids"]:
                used.update(ids)
            batch = []
    return used


def spelling_ids(tokenizer: PreTrainedTokenizerFast) -> set[int]:
    """The ids any input may need: special tokens, single characters (and `##c` for WordPiece),
    Unigram's byte fallbacks <0xNN>."""
    model = tokenizer_model(tokenizer)
    prefix = model.get("continuing_subword_prefix") or ""
    keep = set(tokenizer.all_special_ids)
    for token, index in tokenizer.get_vocab().items():
        bare = token[len(prefix):] if prefix and token.startswith(prefix) else token
        bare = bare.lstrip("\u2581")  # Unigram's word-start mark
        if len(bare) <= 1 or (token.startswith("<0x") and token.endswith(">") and len(token) == 6):
            keep.add(index)
    return keep


def trim(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, keep: set[int]) -> Trimmed:
    """The model and tokenizer cut to the ids `keep` (plus every spelling id), renumbered in order."""
    vocab_size = model.get_input_embeddings().weight.shape[0]
    kept = torch.tensor(sorted((keep | spelling_ids(tokenizer)) & set(range(vocab_size))))
    old_to_new = torch.full((vocab_size,), -1, dtype=torch.long)
    old_to_new[kept] = torch.arange(len(kept))
    unk = tokenizer.unk_token_id
    if unk is None or old_to_new[unk] < 0:
        raise UserError("export --trim-vocab: the tokenizer has no unknown token to stand for the cut ones")
    old_to_new[old_to_new < 0] = old_to_new[unk]
    return Trimmed(_cut_model(model, kept), _cut_tokenizer(tokenizer, kept, old_to_new), kept, old_to_new)


def _cut_model(model: PreTrainedModel, kept: torch.Tensor) -> PreTrainedModel:
    trimmed = copy.deepcopy(model)
    remap = {int(old_id): new_id for new_id, old_id in enumerate(kept.tolist())}
    old = trimmed.get_input_embeddings()
    # the padding row keeps its role (no gradient when the trimmed model is fine-tuned further)
    new = torch.nn.Embedding(len(kept), old.weight.shape[1], padding_idx=remap.get(old.padding_idx))
    new.weight.data = old.weight.data[kept].clone()
    trimmed.set_input_embeddings(new)
    out = trimmed.get_output_embeddings()  # a tied LM head: its rows and bias cut the same way
    if out is not None and out.weight.shape[0] == old.weight.shape[0]:
        out.weight = new.weight if trimmed.config.tie_word_embeddings else torch.nn.Parameter(out.weight[kept].clone())
        if getattr(out, "bias", None) is not None:
            out.bias = torch.nn.Parameter(out.bias[kept].clone())
    trimmed.config.vocab_size = len(kept)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id"):
        value = getattr(trimmed.config, key, None)
        if isinstance(value, int) and value in remap:
            setattr(trimmed.config, key, remap[value])
    return trimmed


def _cut_tokenizer(tokenizer: PreTrainedTokenizerFast, kept: torch.Tensor,
                   old_to_new: torch.Tensor) -> PreTrainedTokenizerFast:
    """tokenizer.json with the vocabulary cut, every id it names (added tokens, the post-processor's
    special tokens, padding) renumbered."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    model, keep = state["model"], set(kept.tolist())
    if model["type"] == "WordPiece":
        model["vocab"] = {token: int(old_to_new[i]) for token, i in sorted(model["vocab"].items(), key=lambda t: t[1])
                          if i in keep}
    else:  # Unigram: a list of [piece, score], the id its position
        model["vocab"] = [entry for i, entry in enumerate(model["vocab"]) if i in keep]
        if model.get("unk_id") is not None:
            model["unk_id"] = int(old_to_new[model["unk_id"]])
    for added in state.get("added_tokens") or []:
        added["id"] = int(old_to_new[added["id"]])
    _renumber_post_processor(state.get("post_processor"), old_to_new)
    if state.get("padding"):
        state["padding"]["pad_id"] = int(old_to_new[state["padding"]["pad_id"]])
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)),
                                   **{k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
                                   model_max_length=tokenizer.model_max_length,
                                   model_input_names=list(tokenizer.model_input_names))
    return fast


def _renumber_post_processor(node: dict | None, old_to_new: torch.Tensor) -> None:
    """The special-token ids a post-processor holds: TemplateProcessing's special_tokens,
    BertProcessing's and RobertaProcessing's cls and sep ([token, id]), a Sequence's processors."""
    if not node:
        return
    for special in (node.get("special_tokens") or {}).values():
        special["ids"] = [int(old_to_new[i]) for i in special["ids"]]
    for key in ("cls", "sep"):
        if isinstance(node.get(key), list):
            node[key][1] = int(old_to_new[node[key][1]])
    for child in node.get("processors") or []:
        _renumber_post_processor(child, old_to_new)


@torch.inference_mode()
def prove(model: PreTrainedModel, trimmed: Trimmed, untrimmed_batches: Iterable[dict],
          trimmed_batches: Iterable[dict]) -> dict[str, int]:
    """Both models on every dev row (the untrimmed tokenizer's batches and the trimmed one's, in
    the same order): a row without a trimmed token must have the same tokens (renumbered) and the
    same predictions; a UserError names the first that does not. Rows with one are counted, with
    how many the trimmed model, on its own tokens, still predicts alike. The counts, by figure:
    dev_rows; dev_rows_with_trimmed, whose untrimmed tokens include a trimmed one (the unknown
    token stands for it); dev_rows_equal, without one, whose tokens and predictions are the
    trimmed model's too; dev_rows_with_trimmed_agree, with one, whose prediction the trimmed
    model still gives."""
    proof = dict.fromkeys(("dev_rows", "dev_rows_with_trimmed", "dev_rows_equal", "dev_rows_with_trimmed_agree"), 0)
    model.eval()
    trimmed.model.eval()
    kept = torch.zeros(len(trimmed.old_to_new), dtype=torch.bool)
    kept[trimmed.kept] = True
    for full, cut in zip(untrimmed_batches, trimmed_batches, strict=True):
        ids, mask, cut_mask = full["input_ids"], full["attention_mask"].bool(), cut["attention_mask"].bool()
        has_trimmed = (~kept[ids] & mask).any(1)
        inputs = {k: full[k] for k in MODEL_INPUTS if k in full}
        want = _predictions(model(**inputs))
        got = _predictions(trimmed.model(**{**inputs, "input_ids": trimmed.old_to_new[ids]}))
        own = _predictions(trimmed.model(**{k: cut[k] for k in MODEL_INPUTS if k in cut}))
        for row in range(len(ids)):
            real, cut_real = mask[row], cut_mask[row]
            if has_trimmed[row]:
                proof["dev_rows_with_trimmed"] += 1
                proof["dev_rows_with_trimmed_agree"] += _same(want, own, row, real, cut_real)
            elif not torch.equal(trimmed.old_to_new[ids[row][real]], cut["input_ids"][row][cut_real]):
                raise UserError(f"export --trim-vocab: dev row {proof['dev_rows']} has no trimmed token but the "
                                "trimmed tokenizer gives it other tokens: the trimming is not exact for this tokenizer")
            elif _same(want, got, row, real, real):
                proof["dev_rows_equal"] += 1
            else:
                raise UserError(f"export --trim-vocab: dev row {proof['dev_rows']} has no trimmed token and the "
                                "trimmed model predicts it otherwise")
            proof["dev_rows"] += 1
    return proof


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _same(a: list[torch.Tensor], b: list[torch.Tensor], row: int, a_real: torch.Tensor, b_real: torch.Tensor) -> bool:
    """Whether row `row` has the same predictions in a and b: a sequence's label, or each real
    token's (start/end positions: over the real tokens, so only where both have as many)."""
    for x, y in zip(a, b):
        x, y = x[row], y[row]
        if x.dim() == 0:  # one label per row, or a position
            if x.shape != y.shape or not torch.equal(x, y):
                return False
        elif not torch.equal(x[a_real[: len(x)]], y[b_real[: len(y)]]):
            return False
    return True


def _predictions(outputs) -> list[torch.Tensor]:
    """The argmax of every logits tensor a head returns (sequence, token, start/end)."""
    return [value.argmax(-1) for key, value in outputs.items() if key.endswith("logits")]
