"""WikiQA quality and time, the pipeline vs the Hugging Face Trainer at identical settings:
all-MiniLM-L6-v2 on the built-in WikiQA set, batch 16, lr 5e-5 (--lr), linear warm-up 0.1, weight
decay 0.01 (not on biases and LayerNorm weights, on both sides), clipping at 1.0, fused AdamW, 2
epochs, max_length 128, dev evaluated after each epoch, one torch thread. Both sides' scores come from
the same code (WikiQaTask.metrics: P/R/F1 of the positive class, accuracy, MAP/MRR with tied scores
counted as the average over their orders), one seed per round, who goes first alternating.

Alike by construction (checked step by step, see benchmarks/studies/README.md): the initial weights
(the pipeline's model factory after transformers.set_seed(seed)), the pair tokenisation
(WikiQaTask.featurize), the data order (a permutation seeded by seed + epoch on both sides), the
optimizer, schedule and clipping. Not alike: the stream dropout draws from (the Trainer draws its
loader's seed from the global RNG first), so equal seeds are not equal runs; the comparison is of
the two distributions over seeds.

--trainer-dropout-stream gives the pipeline the Trainer's dropout stream: then equal seeds are
nearly equal runs (the same dev F1 and MAP within bf16's noise), the check that nothing else differs;
--dropout-seed-apart measures a candidate change to how the pipeline seeds dropout.

Per run: every dev metric after each epoch; the epoch each side's model selection takes (the
pipeline's best/epoch; for the Trainer, which keeps its last model, the same rule applied to its dev
evaluations: parts/best_model.beats); every test metric of the model each side ends with (the
pipeline's best/, the Trainer's last); training samples/s (evaluations left out) and the job's wall
seconds (the pipeline's whole job: data, model, evaluations, inference benchmark, MLflow; the
Trainer's: model and features built, training, test prediction). Per contender: mean and std over
the seeds of each; the verdict compares test MAP against 2x the pooled std. Results in
benchmarks/studies/results/wikiqa_vs_trainer-lrLR-PRECISIONS-SEEDS-MACHINE-DATE.json.
    python benchmarks/studies/bench_wikiqa_vs_trainer.py --seeds 0-4 --precisions bf16
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py, trainer_contender.py

import trainer_contender  # noqa: E402
from common import STUDY_RESULTS, build_model, last_run, pipeline_run, quiet, save, seed_list, seeds_label  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BATCH, EPOCHS, MAX_LENGTH, WARMUP, WEIGHT_DECAY = 16, 2, 128, 0.1, 0.01
METRICS = ("precision", "recall", "f1", "accuracy", "map", "mrr")
SPREAD_FACTOR = 2.0


def tied_candidates(qids: list, scores: np.ndarray) -> int:
    """Candidates whose score equals another candidate's of the same question."""
    tied = 0
    for q in set(qids):
        s = scores[[i for i, x in enumerate(qids) if x == q]]
        _, counts = np.unique(s, return_counts=True)
        tied += int(counts[counts > 1].sum())
    return tied


def selected_epoch(per_epoch: list[dict], order: tuple[str, ...]) -> int:
    """The epoch (from 1) the pipeline's model selection takes among these dev evaluations."""
    from pipeline.job.parts.best_model import beats

    best, chosen = None, 0
    for epoch, scores in enumerate(per_epoch, start=1):
        if beats(scores, best, order) is not None:
            best, chosen = scores, epoch
    return chosen


def trainer(precision: str, seed: int, lr: float) -> dict:
    start = time.perf_counter()
    task, examples, tokenizer, model, features = build_model("wikiqa", MODEL, MAX_LENGTH, seed,
                                                             splits=("train", "dev", "test"))
    qids = [e["qid"] for e in examples["dev"]]
    per_epoch = []

    def compute_metrics(prediction):
        logits = prediction.predictions
        score = logits[:, 1] - logits[:, 0]
        m = task.metrics({"score": score}, examples["dev"], None)
        per_epoch.append({**m, "tied": tied_candidates(qids, score)})
        return m

    done = trainer_contender.run(model, tokenizer, features["train"], precision=precision, seed=seed, epochs=EPOCHS,
                                 eval_set=features["dev"], compute_metrics=compute_metrics,
                                 per_device_eval_batch_size=64, **trainer_contender.recipe(BATCH, lr, WARMUP,
                                                                                          WEIGHT_DECAY))
    for scores, logged in zip(per_epoch, [h for h in done.trainer.state.log_history if "eval_loss" in h]):
        scores["loss"] = logged["eval_loss"]
    done.trainer.compute_metrics = None  # its metrics are the dev split's
    logits = done.trainer.predict(features["test"].remove_columns("idx")).predictions
    test = task.metrics({"score": logits[:, 1] - logits[:, 0]}, examples["test"], None)
    return {"dev_per_epoch": per_epoch, "selected_epoch": selected_epoch(per_epoch, (task.main_metric,
                                                                                     *task.tie_breakers)),
            "test": test, "samples_per_s": done.samples_per_s, "wall_s": time.perf_counter() - start}


def trainer_dropout_stream() -> None:
    """From now on the pipeline's dropout draws the Trainer's stream: one int64 taken from the global
    RNG at each epoch's start, as the Trainer's DataLoader iterator takes its base seed (with
    no generator of its own); the rest of the run is the pipeline's, unchanged."""
    from pipeline.job import loop as job_loop

    epoch = job_loop.train_epoch

    def drawing(loop, index):
        torch.empty((), dtype=torch.int64).random_()
        return epoch(loop, index)
    job_loop.train_epoch = drawing


def dropout_seed_apart() -> None:
    """From now on the pipeline seeds its dropout stream with numpy.random.SeedSequence([seed, rank,
    1]) rather than seed + rank (which restarts the stream the new head was initialised from, and
    is the seed of epoch `rank`'s data permutation): a candidate change, measured, not shipped."""
    import numpy as np

    from pipeline.job import loop as job_loop

    epoch = job_loop.train_epoch

    def reseeded(loop, index):
        if index == 0 and loop.progress.step == 0:  # right after fit()'s torch.manual_seed(seed + rank)
            torch.manual_seed(int(np.random.SeedSequence([loop.stage.cfg.seed, loop.stage.rt.rank, 1])
                                  .generate_state(1)[0]))
        return epoch(loop, index)
    job_loop.train_epoch = reseeded


def pipeline(precision: str, seed: int, lr: float) -> dict:
    start = time.perf_counter()
    final = pipeline_run(["task=wikiqa", f"model={MODEL}", f"train.batch_size={BATCH}", f"train.lr={lr}",
                          f"train.warmup_ratio={WARMUP}", f"train.weight_decay={WEIGHT_DECAY}",
                          f"train.epochs={EPOCHS}", f"train.max_length={MAX_LENGTH}", "train.eval_batch_size=64",
                          f"precision={precision}", f"seed={seed}"])
    wall = time.perf_counter() - start
    client, run = last_run()
    history = {name: [m.value for m in sorted(client.get_metric_history(run.info.run_id, f"eval/{name}"),
                                              key=lambda m: m.step)] for name in (*METRICS, "loss")}
    per_epoch = [{name: values[i] for name, values in history.items()} for i in range(len(history["map"]))]
    return {"dev_per_epoch": per_epoch, "selected_epoch": int(final["best/epoch"]),
            "best_reason": run.data.tags.get("best/reason", ""),
            "test": {name: final[f"test/{name}"] for name in METRICS},
            "samples_per_s": final["perf/train_samples_per_s"], "wall_s": wall}


def figures(r: dict) -> dict:
    """A run's figures by column: test_METRIC (the model it ends with), dev_METRIC (its last epoch's)."""
    return {**{f"test_{m}": r["test"][m] for m in METRICS},
            **{f"dev_last_{m}": r["dev_per_epoch"][-1][m] for m in METRICS},
            "selected_epoch": r["selected_epoch"], "samples_per_s": r["samples_per_s"], "wall_s": r["wall_s"]}


def pooled(a: list[float], b: list[float]) -> float:
    return math.sqrt((statistics.stdev(a) ** 2 + statistics.stdev(b) ** 2) / 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trainer-dropout-stream", action="store_true",
                        help="the pipeline's dropout draws the Trainer's random stream (trainer_dropout_stream): "
                             "equal seeds become nearly equal runs")
    parser.add_argument("--dropout-seed-apart", action="store_true",
                        help="the pipeline seeds dropout apart from the data order and head init (dropout_seed_apart)")
    parser.add_argument("--runs", nargs="*", default=[], type=Path,
                        help="JSON-lines files of finished runs: a run found there is not run again, a new one is "
                             "appended to the first (so an interrupted comparison, or one split over processes, "
                             "goes on)")
    parser.add_argument("--name", default="wikiqa_vs_trainer",
                        help="the results file's first part (it adds the lr, precisions, seeds, machine and date)")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    if args.trainer_dropout_stream:
        trainer_dropout_stream()
        args.name += "-trainer-dropout-stream"
    if args.dropout_seed_apart:
        dropout_seed_apart()
        args.name += "-dropout-seed-apart"
    runs: dict[str, list[dict]] = {}
    seeds = seed_list(args.seeds)
    finished = {(r["contender"], r["seed"]): r for path in args.runs if path.is_file()
                for r in map(json.loads, path.read_text().splitlines())}
    for precision in args.precisions.split(","):
        for i, seed in enumerate(seeds):
            # alternate who goes first, so a slow drift of the shared machine favours neither
            order = (("pipeline", pipeline), ("Trainer", trainer))[:: 1 if i % 2 == 0 else -1]
            for name, contender in order:
                r = finished.get((f"{name} {precision}", seed))
                if r is None:
                    r = {"seed": seed, **contender(precision, seed, args.lr)}
                    if args.runs:
                        with args.runs[0].open("a") as f:
                            f.write(json.dumps({"contender": f"{name} {precision}", **r}) + "\n")
                r = {k: v for k, v in r.items() if k != "contender"}
                runs.setdefault(f"{name} {precision}", []).append(r)
                shown = figures(r)
                print(f"  {name} {precision} seed {seed}: " + ", ".join(
                    f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), flush=True)
    rows = []
    for name, done in runs.items():
        row = {"contender": name, "seeds": len(done)}
        for key in figures(done[0]):
            values = [figures(r)[key] for r in done]
            row[f"{key} mean"] = statistics.mean(values)
            row[f"{key} std"] = statistics.stdev(values) if len(values) > 1 else None
            row[f"{key} per seed"] = " ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)
        rows.append(row)
    for precision in args.precisions.split(","):
        mine, theirs = runs.get(f"pipeline {precision}", []), runs.get(f"Trainer {precision}", [])
        if len(mine) > 1 and len(theirs) > 1:
            a, b = [r["test"]["map"] for r in mine], [r["test"]["map"] for r in theirs]
            a_speed = statistics.median(x["samples_per_s"] / y["samples_per_s"] for x, y in zip(mine, theirs))
            a_wall = statistics.median(x["wall_s"] / y["wall_s"] for x, y in zip(mine, theirs))
            gap, spread = statistics.mean(a) - statistics.mean(b), SPREAD_FACTOR * pooled(a, b)
            rows.append({"contender": f"pipeline - Trainer {precision}", "seeds": len(a),
                         "test_map mean": gap, "test_map std": pooled(a, b),
                         "verdict": f"test MAP {gap:+.4f}, {'within' if abs(gap) <= spread else 'beyond'} "
                                    f"{SPREAD_FACTOR:g}x the pooled std ({spread:.4f}); training samples/s "
                                    f"{a_speed:.2f}x, job wall {a_wall:.2f}x (paired medians)"})
    columns = list(dict.fromkeys(k for row in rows for k in row))
    settings = {"model": MODEL, "batch": BATCH, "lr": args.lr, "warmup_ratio": WARMUP, "weight_decay": WEIGHT_DECAY,
                "epochs": EPOCHS, "max_length": MAX_LENGTH, "seeds": args.seeds, "precisions": args.precisions,
                "threads": args.threads, "trainer_dropout_stream": args.trainer_dropout_stream,
                "dropout_seed_apart": args.dropout_seed_apart}
    save(f"{args.name}-lr{args.lr:g}-{args.precisions.replace(',', '+')}-{seeds_label(seeds)}", rows, columns,
         settings, runs, results=STUDY_RESULTS)


if __name__ == "__main__":
    main()
