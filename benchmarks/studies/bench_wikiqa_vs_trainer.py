"""WikiQA's ranking score, the pipeline vs the Hugging Face Trainer, identical settings on both
sides: all-MiniLM-L6-v2 on the built-in WikiQA set, batch 16, lr 1e-4, linear warm-up 0.1, weight
decay 0.01 (not on biases and LayerNorm weights, on both sides), clipping at 1.0, 2 epochs,
max_length 128, dev evaluated after each epoch, one torch thread. Both sides' dev scores come from
the same code (WikiQaTask.metrics: MAP/MRR with tied scores counted as the average over their
orders). Per run: dev F1 and MAP after each epoch, the pipeline's selected epoch (best dev F1),
and on the Trainer's last dev predictions how many candidates share a score with another of their
question and what MAP would be if ties were broken in file order (the optimistic order on WikiQA,
whose files list a question's sentences in document order) - the size of a tie-handling artefact.
Both sides' Trainer is trainer_contender.run; results in
benchmarks/studies/results/wikiqa_vs_trainer-PRECISIONS-SEEDS-MACHINE-DATE.json.
    python benchmarks/studies/bench_wikiqa_vs_trainer.py --seeds 1-10 --precisions bf16,fp32
"""
import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py, trainer_contender.py

import trainer_contender  # noqa: E402
from common import STUDY_RESULTS, build_model, last_run, pipeline_run, quiet, save, seed_list, seeds_label  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BATCH, LR, EPOCHS, MAX_LENGTH = 16, 1e-4, 2, 128


def tied_candidates(qids: list, scores: np.ndarray) -> int:
    """Candidates whose score equals another candidate's of the same question."""
    tied = 0
    for q in set(qids):
        s = scores[[i for i, x in enumerate(qids) if x == q]]
        _, counts = np.unique(s, return_counts=True)
        tied += int(counts[counts > 1].sum())
    return tied


def map_in_file_order(qids: list, labels: np.ndarray, scores: np.ndarray) -> float:
    """MAP with ties broken by the candidates' order in the file (a stable sort)."""
    aps = []
    for q in dict.fromkeys(qids):
        rows = [i for i, x in enumerate(qids) if x == q]
        y = labels[rows][np.argsort(-scores[rows], kind="stable")]
        if y.sum():
            hits = np.cumsum(y)
            aps.append(float((hits / np.arange(1, len(y) + 1))[y == 1].mean()))
    return float(np.mean(aps))


def trainer(precision: str, seed: int) -> dict:
    task, examples, tokenizer, model, features = build_model("wikiqa", MODEL, MAX_LENGTH, seed)
    qids = [e["qid"] for e in examples["dev"]]
    epochs = []

    def compute_metrics(prediction):
        logits = prediction.predictions
        score = logits[:, 1] - logits[:, 0]
        m = task.metrics({"score": score}, examples["dev"], None)
        epochs.append({**m, "tied": tied_candidates(qids, score),
                       "map_file_order": map_in_file_order(qids, np.array([e["label"] for e in examples["dev"]]),
                                                           score)})
        return m

    trainer_contender.run(model, tokenizer, features["train"], precision=precision, seed=seed, epochs=EPOCHS,
                          eval_set=features["dev"], compute_metrics=compute_metrics, per_device_eval_batch_size=64,
                          **trainer_contender.recipe(BATCH, LR))
    last = epochs[-1]
    return {"dev_f1": last["f1"], "dev_map": last["map"], "dev_map_per_epoch": [e["map"] for e in epochs],
            "dev_f1_per_epoch": [e["f1"] for e in epochs], "tied": last["tied"],
            "map_file_order": last["map_file_order"]}


def pipeline(precision: str, seed: int) -> dict:
    final = pipeline_run(["task=wikiqa", f"model={MODEL}", f"train.batch_size={BATCH}", f"train.lr={LR}",
                          "train.warmup_ratio=0.1", "train.weight_decay=0.01", f"train.epochs={EPOCHS}",
                          f"train.max_length={MAX_LENGTH}", "train.eval_batch_size=64", f"precision={precision}",
                          f"seed={seed}"])
    client, run = last_run()
    maps = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "eval/map"), key=lambda m: m.step)]
    f1s = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "eval/f1"), key=lambda m: m.step)]
    return {"dev_f1": final["eval/f1"], "dev_map": final["eval/map"], "dev_map_per_epoch": maps,
            "dev_f1_per_epoch": f1s, "dev_map_last_epoch": maps[-1]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1-4")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="wikiqa_vs_trainer",
                        help="the results file's first part (it adds the precisions, seeds, machine and date)")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    runs: dict[str, list[dict]] = {}
    seeds = seed_list(args.seeds)
    for precision in args.precisions.split(","):
        for i, seed in enumerate(seeds):
            # alternate who goes first, so a slow drift of the shared machine favours neither
            order = (("pipeline", pipeline), ("Trainer", trainer))[:: 1 if i % 2 == 0 else -1]
            for name, contender in order:
                r = {"seed": seed, **contender(precision, seed)}
                runs.setdefault(f"{name} {precision}", []).append(r)
                print(f"  {name} {precision} seed {seed}: " + ", ".join(
                    f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k != "seed"),
                    flush=True)
    rows = []
    for name, done in runs.items():
        row = {"contender": name, "seeds": len(done)}
        for key in ("dev_f1", "dev_map", "dev_map_last_epoch", "tied", "map_file_order"):
            values = [r[key] for r in done if key in r]
            if values:
                row[f"{key} mean"] = statistics.mean(values)
                row[f"{key} std"] = statistics.stdev(values) if len(values) > 1 else None
                row[f"{key} per seed"] = " ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    settings = {"model": MODEL, "batch": BATCH, "lr": LR, "epochs": EPOCHS, "max_length": MAX_LENGTH,
                "seeds": args.seeds, "precisions": args.precisions, "threads": args.threads}
    save(f"{args.name}-{args.precisions.replace(',', '+')}-{seeds_label(seeds)}", rows, columns, settings, runs,
         results=STUDY_RESULTS)


if __name__ == "__main__":
    main()
