"""The vocabulary cut to the training data's tokens (pipeline/export/trim_vocab.py): the tokenizer
and the embeddings cut together, an input of kept tokens tokenized and predicted the same, what
cannot be cut exactly refused."""
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

from pipeline.errors import UserError
from pipeline.export import trim_vocab

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "##ed", "##ing", "rain", "bow", "##bow"]
CHARS = [*"abcdefghijklmnopqrstuvwxyz", *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]


def wordpiece() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([*SPECIALS, *WORDS, *CHARS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def tiny_bert(vocab_size: int) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=3, hidden_dropout_prob=0, attention_probs_dropout_prob=0)
    return BertForSequenceClassification(config).eval()


def test_an_input_of_kept_tokens_is_tokenized_and_predicted_the_same():
    tok = wordpiece()
    model = tiny_bert(len(tok))
    kept = trim_vocab.used_ids(tok, ["the cat sat on the mat", ("the dogs ran", "rainbow")])
    cut = trim_vocab.trim(model, tok, kept)
    vocab = cut.tokenizer.get_vocab()
    # what spells any input stays: specials, single characters and their continuations
    assert {*SPECIALS, *CHARS} <= set(vocab) and "far" not in vocab and "##ing" not in vocab
    assert cut.model.config.vocab_size == len(vocab) == cut.model.get_input_embeddings().weight.shape[0]
    for text in ["the cat sat on the mat", "the dogs ran"]:
        full, short = tok(text, return_tensors="pt"), cut.tokenizer(text, return_tensors="pt")
        assert torch.equal(cut.old_to_new[full["input_ids"]], short["input_ids"])  # same tokens, renumbered
        assert torch.allclose(model(**full).logits, cut.model(**short).logits, atol=1e-6)
    # a cut word is spelled from what is left, never the unknown token
    assert cut.tokenizer.tokenize("far") == ["f", "##a", "##r"]
    proof = trim_vocab.prove(model, cut, [dict(tok(["the cat", "far"], padding=True, return_tensors="pt"))],
                             [dict(cut.tokenizer(["the cat", "far"], padding=True, return_tensors="pt"))])
    assert (proof["dev_rows"], proof["dev_rows_equal"], proof["dev_rows_with_trimmed"]) == (2, 1, 1)


def test_the_embedding_rows_follow_their_tokens():
    tok = wordpiece()
    model = tiny_bert(len(tok))
    cut = trim_vocab.trim(model, tok, trim_vocab.used_ids(tok, ["the mat"]))
    old, new = model.get_input_embeddings().weight, cut.model.get_input_embeddings().weight
    for token in ["the", "mat", "[CLS]", "##z"]:
        assert torch.equal(new[cut.tokenizer.convert_tokens_to_ids(token)], old[tok.convert_tokens_to_ids(token)])
    # the padding row is still the padding row (no gradient if the trimmed model is trained on)
    assert cut.model.get_input_embeddings().padding_idx == cut.tokenizer.pad_token_id == cut.model.config.pad_token_id


def test_a_dev_row_predicted_otherwise_fails_the_proof():
    tok = wordpiece()
    model = tiny_bert(len(tok))
    cut = trim_vocab.trim(model, tok, trim_vocab.used_ids(tok, ["the cat"]))
    with torch.no_grad():
        cut.model.classifier.bias += torch.tensor([0.0, 0.0, 100.0])  # a different model: every row says 2
    batch = dict(tok(["the cat"], return_tensors="pt"))
    with pytest.raises(UserError, match="dev row 0 has no trimmed token and the trimmed model predicts it otherwise"):
        trim_vocab.prove(model, cut, [batch], [dict(cut.tokenizer(["the cat"], return_tensors="pt"))])


def test_a_bpe_tokenizer_is_refused_in_one_line():
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "[UNK]": 3}, [("a", "b")], unk_token="[UNK]"))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]")
    with pytest.raises(UserError) as e:
        trim_vocab.tokenizer_model(tok)
    assert str(e.value).startswith("export --trim-vocab: a BPE tokenizer: only WordPiece and Unigram keep")
    assert "\n" not in str(e.value)


def test_a_unigram_tokenizer_is_cut_with_its_scores_and_unknown_id():
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [("<unk>", 0.0), ("<pad>", 0.0), ("\u2581the", -1.0), ("\u2581cat", -2.0), ("\u2581dog", -2.0),
              *((f"\u2581{c}", -5.0) for c in letters), *((c, -6.0) for c in letters)]
    uni = Tokenizer(models.Unigram(pieces, unk_id=0))
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=uni, unk_token="<unk>", pad_token="<pad>")
    model = tiny_bert(len(tok))
    cut = trim_vocab.trim(model, tok, trim_vocab.used_ids(tok, ["the cat"]))
    assert "\u2581dog" not in cut.tokenizer.get_vocab() and "\u2581cat" in cut.tokenizer.get_vocab()
    assert cut.tokenizer.tokenize("the cat") == tok.tokenize("the cat")
    assert cut.tokenizer.tokenize("dog") == ["\u2581d", "o", "g"]


def test_a_roberta_post_processors_special_ids_are_renumbered():
    """RobertaProcessing (as XLM-R's Unigram tokenizer has) names its specials as [token, id]: with
    the specials last in the vocabulary, their ids move with the cut."""
    pieces = [("<unk>", 0.0), ("<pad>", 0.0), ("\u2581ab", -1.0), ("\u2581ca", -1.0),
              *((f"\u2581{c}", -5.0) for c in "abc"), *((c, -6.0) for c in "abc"), ("<s>", 0.0), ("</s>", 0.0)]
    uni = Tokenizer(models.Unigram(pieces, unk_id=0))
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.post_processor = processors.Sequence([processors.RobertaProcessing(("</s>", len(pieces) - 1),
                                                                           ("<s>", len(pieces) - 2))])
    tok = PreTrainedTokenizerFast(tokenizer_object=uni, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>", cls_token="<s>", sep_token="</s>")
    model = tiny_bert(len(tok))
    cut = trim_vocab.trim(model, tok, trim_vocab.used_ids(tok, ["ab"]))
    assert "\u2581ca" not in cut.tokenizer.get_vocab()
    full, short = tok("ab", return_tensors="pt"), cut.tokenizer("ab", return_tensors="pt")
    assert cut.tokenizer.convert_ids_to_tokens(short["input_ids"][0]) == ["<s>", "\u2581ab", "</s>"]
    assert torch.equal(cut.old_to_new[full["input_ids"]], short["input_ids"])
    assert torch.allclose(model(**full).logits, cut.model(**short).logits, atol=1e-6)
