"""Prepared data: normalized examples and tokenized features on disk as Arrow (memory-mapped),
built once per fingerprint and shared by the ranks of a job, later stages and study cells.

Two kinds of entry under $PIPELINE_CACHE/features/ (cache_root()):
  examples-KEY/  the training split as read, validated and normalized (`examples/`), the texts a
                 preset's tokenizer is trained on (`texts/`), and meta.json (rows, digest, the
                 task's state after loading). KEY: the file's sha256 (or hub id + the dataset's
                 fingerprint), task and options, normalizer version, FORMAT_VERSION.
  SPLIT-KEY/     one split's features (`data/`, what task.featurize returns) and meta.json.
                 KEY: the examples' key, the tokenizer (class, vocabulary and pipeline, special
                 tokens), max_length, the tokenizers/transformers versions, FORMAT_VERSION.
Local rank 0 of each node builds a missing or unreadable entry (a node-local cache works: each
node builds its own; on shared storage the atomic rename keeps the first copy and drops the
others) while the other ranks wait in one collective, which also carries a builder's error to
every rank; then every rank memory-maps the entry. Training rows never sit in a rank's memory
as Python objects once prepared: the training split is a TrainRows (size, digest, texts), and
each split's features a PreparedFeatures (the memory-mapped Dataset, its key, hit or miss); both
are in prepared.py.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.data.prepared import PreparedFeatures, TrainRows
from pipeline.errors import UserError
from pipeline.fsutil import atomic_dir, cache_root, file_sha256, write_json
from pipeline.runtime import collectives
from pipeline.runtime.world import Runtime

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

    from pipeline.tasks.base import Task

FORMAT_VERSION = 1
"""Bump when a reader, a normalization or a featurize changes what it produces: old entries are
then never matched again."""
NORMALIZER_DISTRIBUTION = "csebuetnlp-normalizer"
log = logging.getLogger("pipeline")


def features_dir() -> Path:
    return cache_root() / "features"


# ---------------------------------------------------------------------- fingerprints


def _digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


@functools.cache
def normalizer_version() -> str:
    """The csebuetnlp normalizer (module `normalizer`): its distribution's version and a hash of
    its sources, so an upgrade or a local edit both count (asking importlib which distribution
    owns the module costs ~0.7 s, so the name is the one pyproject.toml depends on)."""
    import importlib.metadata

    import normalizer

    try:
        version = importlib.metadata.version(NORMALIZER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    h = hashlib.sha256()
    for source in sorted(Path(normalizer.__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return f"{NORMALIZER_DISTRIBUTION}=={version}+{h.hexdigest()[:12]}"


def content_sha256(path: Path) -> str:
    """file_sha256, remembered under the file's identity and change stamps (device, inode, size,
    mtime and ctime: the kernel sets ctime on every write and it cannot be set back, as git's
    index relies on), so a warm start does not read a large file again (1M rows: 289 MiB,
    10 s on this machine's disk)."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo = features_dir() / "sources" / f"{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.sha256"
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = file_sha256(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=f".{memo.name}.")  # ranks may write it at once
    with os.fdopen(fd, "w") as f:
        f.write(digest)
    os.replace(tmp, memo)
    return digest


def source_identity(task: Task, spec: str | None, split: str) -> str:
    """What the split's rows are: a file's content hash, or a hub dataset's id and fingerprint
    (datasets derives it from the downloaded revision)."""
    source = task.resolve_source(spec, split)
    if source.startswith("hub:"):
        from pipeline.tasks.readers import load_hub_split

        # datasets has no public accessor for a split's fingerprint; it is part of the examples' key
        return f"{source}|{split}|{load_hub_split(source, split)._fingerprint}"
    return f"sha256:{content_sha256(Path(source))}"


def examples_key(task: Task, spec: str | None, split: str) -> str:
    return _digest({"kind": "examples", "format": FORMAT_VERSION, "split": split, "task": task.name,
                    "options": task.options, "source": source_identity(task, spec, split),
                    "normalizer": normalizer_version()})


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> str:
    """Class, vocabulary and the whole pipeline of a fast tokenizer (normalizer, pre-tokenizer,
    model, post-processor), special tokens and input names; never a path, and not the backend's
    truncation/padding settings, which a call changes."""
    parts = {"class": type(tokenizer).__name__, "specials": list(zip(tokenizer.all_special_tokens,
                                                                      tokenizer.all_special_ids)),
             "inputs": list(tokenizer.model_input_names), "sides": [tokenizer.padding_side, tokenizer.truncation_side]}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        parts["backend"] = {k: v for k, v in spec.items() if k not in ("truncation", "padding")}
    else:
        parts["vocab"] = sorted(tokenizer.get_vocab().items())
    return _digest(parts)


def features_key(task: Task, source_key: str, split: str, tokenizer: PreTrainedTokenizerBase, max_length: int) -> str:
    import tokenizers
    import transformers

    return _digest({"kind": "features", "format": FORMAT_VERSION, "split": split, "source": source_key,
                    "task": task.name, "options": task.options, "tokenizer": tokenizer_identity(tokenizer),
                    "max_length": max_length, "libraries": [tokenizers.__version__, transformers.__version__]})


class ExamplesDigest:
    """The 16-hex-digit digest describe_datasets records for a split: sha256 of json.dumps of the
    list of examples, fed piece by piece (the same bytes, without one string of the whole split,
    or the whole list, in memory)."""

    def __init__(self):
        self._hash, self.count = hashlib.sha256(b"["), 0

    def update(self, examples: Iterable[dict]) -> None:
        for example in examples:
            self._hash.update((", " if self.count else "").encode()
                              + json.dumps(example, sort_keys=True, ensure_ascii=False, default=str).encode())
            self.count += 1

    def hexdigest(self) -> str:
        final = self._hash.copy()
        final.update(b"]")
        return final.hexdigest()[:16]


def examples_digest(examples: list[dict]) -> str:
    digest = ExamplesDigest()
    digest.update(examples)
    return digest.hexdigest()


def update_texts_hash(h: hashlib._Hash, texts: Iterable[str]) -> None:
    """Feed texts to a sha256, each followed by a NUL byte: the key of a preset's tokenizer."""
    for text in texts:
        h.update(text.encode("utf-8") + b"\0")


# ---------------------------------------------------------------------- the entries


def prepare_train(task: Task, spec: str | None, rt: Runtime) -> TrainRows:
    """The training split's examples entry (built by local rank 0 on a miss); the task's state
    after loading is restored on every rank, as if it had read the file."""
    key = examples_key(task, spec, "train")
    final = features_dir() / f"examples-{key}"
    built: dict = {}

    def build(tmp: Path) -> None:
        import datasets

        # piece by piece (Task.load_chunks): each piece is written to disk before the next is
        # read, and the pieces are joined as memory-mapped Arrow, so a large file's rows are
        # never all in memory as Python objects
        digest, text_hash, kept, pieces, schema, text_count = ExamplesDigest(), hashlib.sha256(), [], [], None, 0
        for chunk in task.load_chunks(spec, "train"):
            piece = tmp / "pieces" / str(len(pieces))
            examples = datasets.Dataset.from_list(chunk, features=schema)
            schema = examples.features
            examples.save_to_disk(str(piece / "examples"))
            texts = list(task.texts(chunk))
            datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(piece / "texts"))
            digest.update(chunk)
            update_texts_hash(text_hash, texts)
            text_count += len(texts)
            pieces.append(piece)
            if not task.featurize_reads_datasets:
                kept.extend(chunk)  # featurize reads them as Python objects: kept, not read back
            del chunk, examples, texts
        for name in ("examples", "texts"):
            _join_saved([piece / name for piece in pieces], tmp / name)
        shutil.rmtree(tmp / "pieces")
        write_json(tmp / "meta.json", {"format": FORMAT_VERSION, "key": key, "rows": digest.count,
                                       "digest": digest.hexdigest(), "texts_sha256": text_hash.hexdigest(),
                                       "state": task.state(), "datasets": {"examples": digest.count,
                                                                           "texts": text_count}})
        if not task.featurize_reads_datasets:
            built["rows"] = kept

    meta, outcome = shared_entry(final, build, rt, f"train examples ({spec or 'sample set'})", ("examples", "texts"))
    task.restore_state(meta["state"])
    return TrainRows(final, meta, outcome, built.get("rows"))


def _join_saved(parts: list[Path], final: Path) -> None:
    """Saved datasets -> one saved dataset at `final`: one part is moved (a saved dataset's files
    are relative to its folder); more are concatenated memory-mapped and written out in shards."""
    import datasets

    if len(parts) == 1:
        parts[0].rename(final)
        return
    datasets.concatenate_datasets([datasets.load_from_disk(str(part)) for part in parts]).save_to_disk(str(final))


def prepare_features(task: Task, split: str, spec: str | None, examples: list[dict] | TrainRows,
                     tokenizer: PreTrainedTokenizerBase, max_length: int, rt: Runtime) -> PreparedFeatures:
    """One split's features, memory-mapped from its entry (built by local rank 0 on a miss)."""
    import datasets

    source_key = examples.key if isinstance(examples, TrainRows) else examples_key(task, spec, split)
    key = features_key(task, source_key, split, tokenizer, max_length)
    final = features_dir() / f"{split}-{key}"

    def build(tmp: Path) -> None:
        rows = examples
        if isinstance(examples, TrainRows):
            rows = examples.dataset() if task.featurize_reads_datasets else examples.examples()
        caching = datasets.is_caching_enabled()
        datasets.disable_caching()  # a map over memory-mapped examples writes a temporary file, not into their entry
        try:
            features = task.featurize(rows, tokenizer, max_length, split)
            features.save_to_disk(str(tmp / "data"))
        finally:
            if caching:
                datasets.enable_caching()
        write_json(tmp / "meta.json", {"format": FORMAT_VERSION, "key": key, "state": task.state(),
                                       "datasets": {"data": len(features)}})

    meta, outcome = shared_entry(final, build, rt, f"{split} features (max_length {max_length})", ("data",))
    task.restore_state(meta["state"])
    return PreparedFeatures(datasets.load_from_disk(str(final / "data")), key, outcome)


def cache_outcome(train: TrainRows, prepared: dict[str, PreparedFeatures]) -> str:
    """hit: every entry of the stage was found; miss: none was (a node built them); partial: some."""
    outcomes = {train.cache_outcome, *(features.cache_outcome for features in prepared.values())}
    return outcomes.pop() if len(outcomes) == 1 else "partial"


def sequence_lengths(features: datasets.Dataset | PreparedFeatures) -> list[int]:
    """Every row's number of input ids, in the rows' order (a selection's too), read from the
    Arrow column: no Python list per row (a length-grouped sampler or a FLOP count over a
    memory-mapped split needs only these)."""
    import pyarrow.compute as pc

    return pc.list_value_length(features.with_format("arrow")["input_ids"]).to_pylist()


# ---------------------------------------------------------------------- one builder per node


def shared_entry(final: Path, build: Callable[[Path], None], rt: Runtime, what: str,
                  datasets_in: tuple[str, ...]) -> tuple[dict, str]:
    """Local rank 0 makes sure `final` is complete (builds it on a miss, rebuilds it if it is
    unreadable); every rank waits in one collective that also brings a builder's error to all
    of them, so a bad file fails every rank with the same line instead of leaving them waiting
    until the process-group timeout. Returns the entry's meta.json, and "miss" if any node built
    it, else "hit"."""
    failure, outcome = None, None
    if rt.local_rank == 0:
        try:
            outcome = "hit" if _readable(final, datasets_in) else "miss"
            if outcome == "miss":
                _set_aside(final)
                with atomic_dir(final) as tmp:  # another node's copy renamed in first: theirs is kept
                    build(tmp)
            # debug: a bad input later in build_stage must stay a one-line error; the run's tag
            # data_cache says hit or miss
            log.debug("prepared data: %s: %s (%s)", outcome, what, final.name)
        except Exception as e:
            failure = e
    reports = collectives.all_gather_objects((outcome, None if failure is None else (isinstance(failure, UserError),
                                                                               str(failure))))
    if failure is not None:
        raise failure
    failed = [error for _, error in reports if error is not None]
    if failed:
        is_user, message = failed[0]
        raise UserError(message) if is_user else RuntimeError(f"data preparation failed on another node: {message}")
    meta = _read_meta(final)
    if meta is None:
        raise RuntimeError(f"{final}: prepared by local rank 0 but not readable here (is {features_dir()} "
                           "the same directory for every rank of a node?)")
    return meta, "miss" if any(built == "miss" for built, _ in reports) else "hit"


def _read_meta(final: Path) -> dict | None:
    try:
        meta = json.loads((final / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION else None


def _readable(final: Path, datasets_in: tuple[str, ...]) -> bool:
    """A complete entry: its meta.json, and every dataset loads with the rows meta.json names
    (a truncated or missing Arrow file, a half-copied folder: rebuilt, never trusted)."""
    import datasets

    meta = _read_meta(final)
    if meta is None:
        return False
    try:
        return all(len(datasets.load_from_disk(str(final / name))) == meta["datasets"][name] for name in datasets_in)
    except Exception:  # noqa: BLE001 - whatever is wrong with it, the entry is rebuilt
        return False


def _set_aside(final: Path) -> None:
    """Remove an unreadable entry: renamed first (a reader never sees it half deleted); another
    node may have removed it already."""
    if not final.exists():
        return
    log.warning("prepared data: %s is incomplete or unreadable: building it again", final)
    aside = final.with_name(f".{final.name}.unreadable-{os.getpid()}")
    try:
        final.rename(aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)
