"""The loop's phases in one process, in milliseconds: a tiny torch model, batches in a list and an
in-process backend stand in for the data pipeline, the transformer and DDP/DeepSpeed (whose own
behaviour tests/integration/test_train.py, test_ddp.py and test_deepspeed.py check through the real launchers).
What these tests pin down is the loop's own bookkeeping: accumulation groups, the LR schedule
around skipped updates, the non-finite streak, checkpoint cadence, preemption, and that a job
killed and resumed from its checkpoint ends exactly where the uninterrupted one does."""
import contextlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import transformers

from helpers import settled_config
from pipeline import names
from pipeline.config import load_config
from pipeline.errors import MachineError, UserError
from pipeline.job import loop as job_loop
from pipeline.job.parts import checkpoint
from pipeline.job.parts.best_model import BestModel
from pipeline.job.parts.optim import build_optimizer
from pipeline.job.parts.step_losses import Diverged, StepLosses
from pipeline.job.plan import Plan
from pipeline.job.stage import Stage
from pipeline.job_record import JobRecord
from pipeline.layout import OutputDir
from pipeline.measure.flops import ModelSize
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import compiler, precision
from pipeline.runtime.backend import StepLoss, StepResult
from pipeline.runtime.preemption import AgreedFlag
from pipeline.runtime.world import Runtime

CPU = torch.device("cpu")


class TinyClassifier(torch.nn.Module):
    """Mean of token embeddings -> 3 classes: no dropout, so every step is deterministic."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return SimpleNamespace(logits=self.head(self.embed(input_ids).mean(dim=1)))


class ClassifyTask:
    main_metric = "accuracy"

    def loss(self, outputs, inputs):
        return F.cross_entropy(outputs.logits.float(), inputs["labels"])


class InProcessBackend:
    """The Backend protocol in one process with a plain AdamW; `applied` scripts which updates are
    skipped (as fp16's scaler or a non-finite gradient would), True for every step when empty."""

    fused_optimizer = False
    loss_scale = None
    extra_artifacts: dict = {}
    extra_tags: dict = {}

    def __init__(self, applied: list[bool] = ()):
        self.applied = list(applied)
        self.steps = 0

    def describe(self):
        return {}

    def prepare(self, model, optimizer, train=None):
        self.module, self.optimizer = model, optimizer
        return model

    def no_sync(self):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def step(self):
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        stepped = self.applied[self.steps] if self.steps < len(self.applied) else True
        if stepped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return StepResult(torch.tensor(stepped), norm)

    def save(self, directory: Path, rank: int):
        torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()},
                   directory / "backend.pt")

    def load(self, directory: Path):
        state = torch.load(directory / "backend.pt", weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def full_state_dict(self):
        return {k: v.detach().clone().float() for k, v in self.module.state_dict().items()}

    def load_full_state_dict(self, state):
        self.module.load_state_dict(state)


class Batches:
    """A training loader: fixed batches, resumable at a micro-batch (as ResumableSampler is)."""

    dev = None  # what the dev loader is: evaluate() is replaced where a test evaluates

    def __init__(self, n: int, rows: int = 4, length: int = 6):
        g = torch.Generator().manual_seed(1)
        self.batches = [{"input_ids": torch.randint(0, 16, (rows, length), generator=g),
                         "attention_mask": torch.ones(rows, length, dtype=torch.long),
                         "labels": torch.randint(0, 3, (rows,), generator=g), "idx": torch.arange(rows)}
                        for _ in range(n)]
        self.skip = 0

    def start_epoch(self, epoch: int, epoch_steps: int):
        self.skip = epoch_steps

    @property
    def train(self):
        return self

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter([dict(b) for b in self.batches[self.skip:]])


class RecordingTracker:
    def __init__(self):
        self.run_id = None
        self.logged: list[tuple[int, dict]] = []
        self.tags: dict[str, str] = {}

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))

    def set_tags(self, tags):
        self.tags.update(tags)


def make_loop(tmp_path, overrides=(), applied=(), micro_batches=6, epochs=1, total_steps=None):
    cfg = load_config(None, [f"output_dir={tmp_path}", "train.lr=1e-2", "train.warmup_ratio=0", "train.epochs=1",
                             "train.group_by_length=false", *overrides])
    rt, task, policy = Runtime("none", "single", 0, 0, 1, 1, CPU), ClassifyTask(), precision.resolve("fp32", CPU)
    settled = settled_config(cfg, "tiny", task)
    record = JobRecord(config={}, global_batch=f"{4 * cfg.train.grad_accum} rows", world_size=1, backend="torch",
                       precision="fp32", data={})
    model = TinyClassifier()
    backend = InProcessBackend(applied)
    plan = Plan(settled, rt, "train", task, policy, record, compiler.resolve(settled.train.compile, "cpu", "single"))
    size = ModelSize(sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters()), None, 8)
    s = Stage(**vars(plan), examples={}, features={}, tokenizer=None, model=model, model_spec="tiny", backend=backend,
              distiller=None, size=size)
    loaders = Batches(micro_batches)
    steps = total_steps or math.ceil(micro_batches / cfg.train.grad_accum) * epochs
    optimizer, scheduler = build_optimizer(model, settled.train, steps, fused=False)
    wrapped = backend.prepare(model, optimizer)
    losses = StepLosses(scheduler, OutputDir(tmp_path), 1, settled.train.max_nonfinite)
    return job_loop.Loop(s, loaders, losses, wrapped, epochs, steps, AgreedFlag(), StageMeters(CPU, "fp32", 1),
                      RecordingTracker())


def logged(lp, name):
    return {step: m[name] for step, m in lp.metrics.tracker.logged if name in m}


def test_an_optimizer_step_every_grad_accum_micro_batches_the_last_group_short(tmp_path):
    lp = make_loop(tmp_path, ["train.grad_accum=2", "train.log_every=1"], micro_batches=5)
    job_loop.train_epoch(lp, 0)
    assert (lp.progress.step, lp.progress.epoch_steps, lp.stage.backend.steps) == (3, 3, 3)
    assert sorted(logged(lp, names.TRAIN_LOSS)) == [1, 2, 3]
    assert lp.meters.throughput.samples == 5 * 4


def test_under_cuda_graphs_a_step_is_marked_once_per_optimizer_step_before_its_first_micro_batch(
        tmp_path, monkeypatch):
    """A CUDA-graph step mark inside an accumulation group would free the first micro-batch's
    `.grad` (an output of the captured backward) before the next backward adds to it
    (CompilePolicy.begin_step). No GPU here: torch's mark is replaced by a recorder, and
    the tiny model is not compiled; what is checked is where the loop marks."""
    lp = make_loop(tmp_path, ["train.grad_accum=2", "train.compile=reduce-overhead"], micro_batches=5)
    events = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    backend = lp.stage.backend
    backward, step = backend.backward, backend.step
    monkeypatch.setattr(backend, "backward", lambda loss: (events.append("backward"), backward(loss))[1])
    monkeypatch.setattr(backend, "step", lambda: (events.append("step"), step())[1])
    job_loop.train_epoch(lp, 0)
    group = ["mark", "backward", "backward", "step"]
    assert events == group + group + ["mark", "backward", "step"]  # the last group is short


def test_an_unpadded_batch_reaches_the_model_without_its_mask_compiled_or_not(tmp_path):
    """Transformers never drops a mask while tracing (masking_utils), so under compile too the loop
    leaves out the mask of a batch without padding, and passes a padded batch's; the losses read it."""
    for mode in ("off", "default"):
        lp = make_loop(tmp_path / mode, [f"train.compile={mode}"], micro_batches=2)
        seen = []
        lp.wrapped.register_forward_pre_hook(lambda _, args, kwargs, seen=seen: seen.append("attention_mask" in kwargs),
                                             with_kwargs=True)
        lp.loaders.batches[1]["attention_mask"][0, -2:] = 0
        job_loop.train_epoch(lp, 0)
        assert seen == [False, True], mode


def test_a_skipped_update_is_given_back_to_the_schedule_when_its_flag_is_read(tmp_path):
    lp = make_loop(tmp_path, ["train.log_every=4"], applied=[True, False, True, True], micro_batches=8)
    job_loop.train_epoch(lp, 0)
    reference = torch.optim.SGD([torch.zeros(1)], lr=1e-2)
    schedule = transformers.get_linear_schedule_with_warmup(reference, 0, 8)
    for _ in range(3):  # the three updates applied by step 4
        reference.step()
        schedule.step()
    assert lp.losses.skipped == 1
    assert logged(lp, names.TRAIN_LR)[4] == pytest.approx(schedule.get_last_lr()[0])
    assert logged(lp, names.SKIPPED_STEPS)[4] == 1


def test_a_streak_of_non_finite_losses_stops_the_job_at_the_step_that_completed_it(tmp_path):
    lp = make_loop(tmp_path, ["train.log_every=10", "train.max_nonfinite=3"], total_steps=6)
    bar = SimpleNamespace(set_postfix=lambda **_: None)
    for loss in (1.0, math.nan, 2.0, math.nan, math.nan):  # a finite loss breaks the first streak
        job_loop.optimizer_step(lp, torch.tensor(loss), 0.5, bar)
    with pytest.raises(Diverged, match="3 consecutive non-finite losses at step 6; last good checkpoint: none"):
        job_loop.optimizer_step(lp, torch.tensor(math.inf), 0.5, bar)  # step 6: the last, so read now
    assert (lp.losses.nonfinite, lp.losses.nonfinite_streak) == (4, 3)


def test_checkpoints_every_save_every_steps_inside_the_epoch_and_one_on_sigterm(tmp_path):
    lp = make_loop(tmp_path, ["train.save_every=2", "train.keep_checkpoints=5"], micro_batches=6)
    job_loop.train_epoch(lp, 0)
    # not 6: the epoch's end saves or finishes
    assert [c.step for c in checkpoint.complete(OutputDir(tmp_path))] == [2, 4]

    lp = make_loop(tmp_path / "preempted", micro_batches=6)
    preempt = lp.preemption.raised
    real_step = lp.stage.backend.step

    def step_then_signal():
        if lp.stage.backend.steps == 2:
            preempt.set()  # SIGTERM during the third step
        return real_step()

    lp.stage.backend.step = step_then_signal
    with pytest.raises(job_loop.Preempted, match="written at step 3"):
        job_loop.train_epoch(lp, 0)
    assert checkpoint.latest(OutputDir(tmp_path / "preempted")).step == 3


def test_a_job_preempted_and_resumed_ends_exactly_where_the_uninterrupted_one_does(tmp_path):
    overrides = ["train.log_every=2", "train.grad_accum=2"]
    whole = make_loop(tmp_path / "whole", overrides, micro_batches=8, epochs=2)
    for epoch in range(2):
        job_loop.train_epoch(whole, epoch)
        whole.progress.epoch, whole.progress.epoch_steps = epoch + 1, 0

    first = make_loop(tmp_path / "cut", overrides, micro_batches=8, epochs=2)
    job_loop.train_epoch(first, 0)
    first.progress.epoch, first.progress.epoch_steps = 1, 0
    preempt = first.preemption.raised
    real_step = first.stage.backend.step
    first.stage.backend.step = lambda: (preempt.set(), real_step())[1]
    with pytest.raises(job_loop.Preempted):
        job_loop.train_epoch(first, 1)  # stopped after the second epoch's first step

    ckpt = checkpoint.latest(OutputDir(tmp_path / "cut"))
    second = make_loop(tmp_path / "cut", overrides, micro_batches=8, epochs=2)  # a fresh process's objects
    second.checkpointer.load(ckpt)
    assert (second.progress.epoch, second.progress.epoch_steps, second.progress.step) == (1, 1, 5)
    job_loop.train_epoch(second, 1)

    assert second.progress.step == whole.progress.step == 8
    assert second.losses.scheduler.state_dict() == whole.losses.scheduler.state_dict()
    resumed_losses, whole_losses = second.losses.state_dict(), whole.losses.state_dict()
    for terms in ("term_sums", "last_terms"):
        assert resumed_losses.pop(terms) == pytest.approx(whole_losses.pop(terms), nan_ok=True)
    assert resumed_losses == pytest.approx(whole_losses, nan_ok=True)
    for (k, a), b in zip(whole.stage.model.state_dict().items(), second.stage.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path):
    checkpoint.save(OutputDir(tmp_path), 3, {"scheduler": {}, "loop": {"step": 3}}, rank=0, keep=1)
    ckpt = checkpoint.latest(OutputDir(tmp_path))
    with pytest.raises(UserError, match=r"^checkpoint .*step-00000003: written in another checkpoint format") as e:
        ckpt.load_bundle()
    assert "\n" not in str(e.value)


def test_the_best_model_keeps_the_best_weights_on_disk_and_counts_evaluations_since(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    config = transformers.BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                     intermediate_size=8, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, "[UNK]")))
    backend = InProcessBackend()
    backend.prepare(model, None)
    best = BestModel()

    assert best.consider({"main": 0.5, "f1": 0.4}, 1, 10.0, backend, tokenizer, OutputDir(tmp_path), is_main=True)
    kept = {k: v.clone() for k, v in best.weights.items()}
    with torch.no_grad():
        model.classifier.weight.add_(1.0)  # training moves on; a worse evaluation keeps nothing
    assert not best.consider({"main": 0.4, "f1": 0.9}, 2, 20.0, backend, tokenizer, OutputDir(tmp_path), is_main=True)
    assert (best.score, best.bad_evals, best.time_to_best, best.epoch) == (0.5, 1, 10.0, 1)
    assert best.metrics == {names.eval_metric("main"): 0.5, names.eval_metric("f1"): 0.4}

    assert OutputDir(tmp_path).trained_model() == tmp_path / "best"
    restored = BestModel()
    restored.load_state_dict(best.state_dict())
    restored.restore_weights(OutputDir(tmp_path).best_weights, backend)
    assert restored.state_dict() == best.state_dict()
    for k, v in kept.items():
        torch.testing.assert_close(restored.weights[k], v, msg=k)


def test_a_checkpoint_that_matches_its_job_but_cannot_be_loaded_is_one_line(tmp_path):
    lp = make_loop(tmp_path, ["train.save_every=1"], micro_batches=2)
    job_loop.train_epoch(lp, 0)
    ckpt = checkpoint.latest(OutputDir(tmp_path))
    state = torch.load(ckpt.path / "backend.pt", weights_only=True)
    state["model"]["head.weight"] = torch.zeros(5, 8)  # saved by a model of another shape
    torch.save(state, ckpt.path / "backend.pt")
    fresh = make_loop(tmp_path, ["train.save_every=1"], micro_batches=2)
    with pytest.raises(MachineError, match=r"^resume: checkpoint .*step-00000001: cannot be loaded \(Error") as e:
        fresh.checkpointer.load(ckpt)
    assert "\n" not in str(e.value)


def test_the_final_metrics_name_the_best_epoch_and_the_run_says_why_it_was_chosen(tmp_path):
    from pipeline.evaluation import Evaluation

    lp = make_loop(tmp_path)
    job_loop.train_epoch(lp, 0)  # the meters' figures need a trained epoch
    lp.meters.end_epoch()
    lp.best.epoch, lp.best.reason = 2, "tie on f1 0.0000: map 0.7857 > 0.7102"
    lp.best.metrics = {names.eval_metric("f1"): 0.0, names.eval_metric("map"): 0.7857}
    lp.progress.step = 7
    final = lp.metrics.log_final(7, *job_loop.final_figures(lp, Evaluation({"main": 0.0, "f1": 0.0, "map": 0.85}), {}))
    assert (final[names.BEST_EPOCH], final[names.eval_metric("map")], final[names.test_metric("map")]) == \
        (2, 0.7857, 0.85)
    assert lp.metrics.tracker.tags[names.TAG_BEST_REASON] == "tie on f1 0.0000: map 0.7857 > 0.7102"
    assert logged(lp, names.BEST_EPOCH) == {7: 2}  # eval/ figures were logged at their epoch, not again
    assert logged(lp, names.eval_metric("map")) == {}


class Killed(Exception):
    """A kill in the middle of a step: nothing is saved, the loop's objects are lost."""


def fake_dev_evaluation(monkeypatch, scores=None):
    """evaluate() and best/'s writer replaced: an evaluation draws from the global RNG first (as a
    DataLoader's iterator draws its base seed), so a resume whose RNG state was saved before an
    evaluation rather than after it draws, and scores, differently; `scores` scripts the scores
    instead. best/ holds the weights alone (restore_weights reads them back)."""
    from safetensors.torch import save_file

    from pipeline.evaluation import Evaluation
    from pipeline.job.parts import best_model

    scripted = iter(scores or ())

    def evaluate(model, *args, **kwargs):
        draw = torch.randint(0, 1000, ()).item()
        main = next(scripted) if scores else draw / 1000 + float(model.head.weight.detach().sum()) * 1e-3
        return Evaluation({"main": main, "accuracy": main})

    monkeypatch.setattr(job_loop, "evaluate", evaluate)
    monkeypatch.setattr(best_model, "save_pretrained_fp32", lambda module, weights, tokenizer, target: (
        target.mkdir(parents=True, exist_ok=True), save_file(weights, target / "model.safetensors")))
    monkeypatch.setattr(best_model, "write_card", lambda *args: None)


def train_until_done(lp):
    """fit()'s epochs, from where the loop's progress is."""
    lp.stage.examples["dev"] = lp.stage.features["dev"] = None
    for epoch in range(lp.progress.epoch, lp.epochs):
        job_loop.train_epoch(lp, epoch)
        if job_loop.end_epoch(lp, epoch):
            break


def test_eval_every_evaluates_between_steps_and_a_job_killed_after_one_resumes_exactly(tmp_path, monkeypatch):
    fake_dev_evaluation(monkeypatch)
    overrides = ["train.eval_every=3", "train.save_every=2", "train.keep_checkpoints=10", "train.log_every=100"]
    whole = make_loop(tmp_path / "whole", overrides, micro_batches=8, epochs=2)
    train_until_done(whole)
    dev = logged(whole, names.eval_metric("main"))
    assert sorted(dev) == [3, 6, 8, 9, 12, 15, 16]  # every 3 optimizer steps, and each epoch's end
    assert whole.best.step in dev and whole.best.metrics[names.eval_metric("main")] == max(dev.values())

    cut = make_loop(tmp_path / "cut", overrides, micro_batches=8, epochs=2)
    real_step = cut.stage.backend.step
    cut.stage.backend.step = lambda: (_ for _ in ()).throw(Killed()) if cut.stage.backend.steps == 6 else real_step()
    with pytest.raises(Killed):  # during step 7: the newest checkpoint is step 6's, saved after its evaluation
        train_until_done(cut)
    ckpt = checkpoint.latest(OutputDir(tmp_path / "cut"))
    assert ckpt.step == 6
    resumed = make_loop(tmp_path / "cut", overrides, micro_batches=8, epochs=2)  # a fresh process's objects
    resumed.checkpointer.load(ckpt)
    resumed.best.restore_weights(ckpt.best_weights(OutputDir(tmp_path / "cut")), resumed.stage.backend)
    train_until_done(resumed)

    assert logged(resumed, names.eval_metric("main")) == {k: v for k, v in dev.items() if k > 6}
    timeless = [{k: v for k, v in b.state_dict().items() if k != "time_to_best"} for b in (resumed.best, whole.best)]
    assert timeless[0] == timeless[1]
    for name, weights in whole.best.weights.items():
        torch.testing.assert_close(resumed.best.weights[name], weights, rtol=0, atol=0, msg=name)
    for (k, a), b in zip(whole.stage.model.state_dict().items(), resumed.stage.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_early_stopping_counts_evaluations_between_steps_and_stops_at_the_step(tmp_path, monkeypatch):
    fake_dev_evaluation(monkeypatch, scores=[0.5, 0.4, 0.3])
    lp = make_loop(tmp_path, ["train.eval_every=2", "train.patience=2", "train.save_every=1"], micro_batches=8)
    train_until_done(lp)
    assert lp.progress.step == 6  # evaluations at 2, 4 and 6; the last two were not better
    assert sorted(logged(lp, names.eval_metric("main"))) == [2, 4, 6]  # not again at the epoch's end
    assert (lp.best.step, lp.best.bad_evals) == (2, 2)
    assert 0 < lp.best.time_to_best < lp.meters.totals.train_seconds  # reached inside the epoch
    assert [c.step for c in checkpoint.complete(OutputDir(tmp_path))][-1] == 5  # none at the step it stopped


def test_named_loss_terms_reach_mlflow_by_name_over_the_window_of_train_loss_and_survive_a_resume(tmp_path):
    """A loss's named terms (StepLoss.terms) travel with the total through the one read of a log step:
    train/loss_<term> is the mean over the same finite steps as train/loss, a checkpoint taken
    mid-window restores the window's term sums, and the final figures (metrics.json) hold the last
    window's terms beside its loss."""
    lp = make_loop(tmp_path, ["train.log_every=3"], total_steps=6)
    bar = SimpleNamespace(set_postfix=lambda **_: None)
    steps = [(1.0, 0.5), (math.nan, math.nan), (3.0, 1.5), (2.0, 1.0), (4.0, 2.0), (6.0, 3.0)]
    for total, kd in steps[:4]:
        job_loop.optimizer_step(lp, StepLoss(torch.tensor(total), {"kd": torch.tensor(kd)}), 0.5, bar)
    lp.losses.read(4)  # what a save does before collecting the state
    saved = lp.losses.state_dict()
    resumed = make_loop(tmp_path / "resumed", ["train.log_every=3"], total_steps=6)
    resumed.losses.load_state_dict(saved)
    resumed.progress.step = 4
    for total, kd in steps[4:]:
        job_loop.optimizer_step(resumed, StepLoss(torch.tensor(total), {"kd": torch.tensor(kd)}), 0.5, bar)
    assert logged(lp, names.train_loss_term("kd")) == {3: pytest.approx(1.0)}  # (0.5 + 1.5) / 2 finite steps
    assert logged(lp, names.TRAIN_LOSS) == {3: pytest.approx(2.0)}
    assert logged(resumed, names.train_loss_term("kd")) == {6: pytest.approx(2.0)}  # (1 + 2 + 3) / 3
    resumed.meters.final_figures = lambda time_to_best: {}  # no timed training here
    final, _ = job_loop.final_figures(resumed, None, {})  # metrics.json's: the last logged window's
    assert final[names.TRAIN_LOSS] == pytest.approx(4.0) and final[names.train_loss_term("kd")] == pytest.approx(2.0)
    old = {k: v for k, v in saved.items() if k not in ("term_sums", "last_terms")}  # a checkpoint before terms
    resumed.losses.load_state_dict(old)
    assert resumed.losses.term_sums == {}


def test_an_epoch_figure_a_producer_adds_reaches_mlflow_by_its_name_through_the_epochs_collective(
        tmp_path, monkeypatch):
    """The meters name one more figure in their Local and their epoch figures: it is logged at the
    epoch's end without a change to the metrics processor or the loop."""
    from pipeline.runtime import collectives

    fake_dev_evaluation(monkeypatch)
    lp = make_loop(tmp_path, ["train.log_every=100"], micro_batches=4)
    local, metrics = lp.meters.epoch_local, lp.meters.epoch_figures

    def epoch_local():
        made = local()
        return collectives.Figures({**made.sums, "widgets": 3.0}, made.maxes, made.mins, made.per_rank)

    monkeypatch.setattr(lp.meters, "epoch_local", epoch_local)
    monkeypatch.setattr(lp.meters, "epoch_figures", lambda reduced: {**metrics(reduced),
                                                                     "perf/widgets": reduced.sums["widgets"]})
    train_until_done(lp)
    assert logged(lp, "perf/widgets") == {lp.progress.step: 3.0}
    assert lp.progress.step in logged(lp, names.SAMPLES_PER_S)


def test_each_epochs_line_and_figure_is_its_mean_loss_whatever_log_every(tmp_path, monkeypatch, caplog):
    """train.log_every longer than an epoch closes no train/loss window inside it: the epoch's loss
    is still its own mean over its finite steps, on the console and as train/epoch_loss."""
    fake_dev_evaluation(monkeypatch)
    lp = make_loop(tmp_path, ["train.log_every=100"], micro_batches=3, epochs=2)
    totals, add = [], lp.losses.add
    monkeypatch.setattr(lp.losses, "add", lambda loss, stepped: (totals.append(float(loss.total)), add(loss, stepped)))
    with caplog.at_level("INFO", logger="pipeline"):
        train_until_done(lp)
    assert logged(lp, names.TRAIN_EPOCH_LOSS) == {3: pytest.approx(sum(totals[:3]) / 3),
                                                   6: pytest.approx(sum(totals[3:]) / 3)}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert len(lines) == 2 and f"loss {sum(totals[:3]) / 3:.4f}" in lines[0] and "nan" not in " ".join(lines)


def test_a_sigterm_on_the_step_an_early_stop_ends_resumes_to_the_stop_not_past_it(tmp_path, monkeypatch):
    """The evaluation between steps that ends training early and a SIGTERM on the same step: the
    checkpoint is the epoch's end, so the resumed job trains no further step and does not evaluate
    that step again; it finishes as the uninterrupted one did."""
    overrides = ["train.eval_every=2", "train.patience=2", "train.keep_checkpoints=10"]
    fake_dev_evaluation(monkeypatch, scores=[0.5, 0.4, 0.3])
    whole = make_loop(tmp_path / "whole", overrides, micro_batches=8)
    train_until_done(whole)

    fake_dev_evaluation(monkeypatch, scores=[0.5, 0.4, 0.3, 0.9])  # a fourth evaluation would be "better"
    cut = make_loop(tmp_path / "cut", overrides, micro_batches=8)
    real_step = cut.stage.backend.step
    cut.stage.backend.step = lambda: (cut.stage.backend.steps == 5 and cut.preemption.raised.set(), real_step())[1]
    with pytest.raises(job_loop.Preempted, match="written at step 6"):
        train_until_done(cut)
    ckpt = checkpoint.latest(OutputDir(tmp_path / "cut"))
    resumed = make_loop(tmp_path / "cut", overrides, micro_batches=8)  # a fresh process's objects
    resumed.checkpointer.load(ckpt)
    resumed.best.restore_weights(ckpt.best_weights(OutputDir(tmp_path / "cut")), resumed.stage.backend)
    train_until_done(resumed)
    assert resumed.progress.step == whole.progress.step == 6
    assert logged(resumed, names.eval_metric("main")) == {}  # step 6 was evaluated before the SIGTERM
    assert (resumed.best.step, resumed.best.bad_evals) == (whole.best.step, whole.best.bad_evals) == (2, 2)
    for (k, a), b in zip(whole.stage.model.state_dict().items(), resumed.stage.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
