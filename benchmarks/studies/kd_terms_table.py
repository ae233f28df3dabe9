"""The per-term table of a kd_terms study (kd_terms_wikiqa.yaml, kd_terms_sentiment.yaml), from its
MLflow runs: per procedure, the test main metric over seeds (mean ± sample sd, each seed), its
retention of the same seed's teacher, the student's size against the teacher, and where the
vocabulary was trimmed (pipeline export --trim-vocab) the trimmed model's size and score.

    python benchmarks/studies/kd_terms_table.py --experiment kd_terms_wikiqa [--uri sqlite:///mlruns/mlflow.db]
"""
from __future__ import annotations

import argparse
import statistics

from mlflow.tracking import MlflowClient

from pipeline import names

PROCEDURES = ("teacher", "logits", "hidden", "attention", "all")


def spread(values: list[float], digits: int = 3) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--uri", default="sqlite:///mlruns/mlflow.db")
    opts = parser.parse_args()
    client = MlflowClient(tracking_uri=opts.uri)
    experiment = client.get_experiment_by_name(opts.experiment)
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.info.status == "FINISHED"
            and r.data.tags.get(names.TAG_PROCEDURE) in PROCEDURES]
    by = {(r.data.tags[names.TAG_PROCEDURE], int(r.data.tags[names.TAG_SEED])): r.data.metrics for r in runs}
    seeds = sorted({seed for _, seed in by})
    print("| procedure | test main, seeds " + " / ".join(map(str, seeds)) + " | mean ± sd | retained of the teacher "
          "(mean ± sd) | params outside embeddings (of the teacher's) |")
    print("|---|---|---|---|---|")
    for procedure in PROCEDURES:
        got = [(seed, by[(procedure, seed)]) for seed in seeds if (procedure, seed) in by]
        if not got:
            continue
        mains = [m[names.TEST_MAIN] for _, m in got]
        kept = [m[names.TEST_MAIN] / by[("teacher", seed)][names.TEST_MAIN] * 100 for seed, m in got
                if ("teacher", seed) in by and by[("teacher", seed)][names.TEST_MAIN] > 0]
        ratio = got[0][1].get(names.KD_PARAM_RATIO_NON_EMBEDDING)
        size = f"{got[0][1].get(names.MODEL_PARAMS_NON_EMBEDDING, float('nan')) / 1e6:.2f}M" + (
            f" ({100 * ratio:.1f}%)" if ratio is not None else "")
        print(f"| {procedure} | {' / '.join(f'{v:.3f}' for v in mains)} | {spread(mains)} | "
              f"{spread(kept, 1) + '%' if kept else 'n/a'} | {size} |")
        trimmed = [m for _, m in got if names.export_metric("trim", "size_mb") in m]
        if trimmed:
            t = trimmed[0]
            fig = {k: t[names.export_metric("trim", k)] for k in ("vocab_size_before", "vocab_size", "size_mb_before",
                                                                  "size_mb", "params_before", "params")}
            scores = [m[names.export_test_metric("fp32", "main")] for m in trimmed]
            equal = sum(m[names.export_metric("trim", "dev_rows_equal")] for m in trimmed)
            rows = sum(m[names.export_metric("trim", "dev_rows")] for m in trimmed)
            cut = sum(m[names.export_metric("trim", "dev_rows_with_trimmed")] for m in trimmed)
            agree = sum(m[names.export_metric("trim", "dev_rows_with_trimmed_agree")] for m in trimmed)
            print(f"| {procedure}, vocabulary trimmed | {' / '.join(f'{v:.3f}' for v in scores)} | {spread(scores)} | "
                  f"vocabulary {fig['vocab_size_before']:.0f} -> {fig['vocab_size']:.0f} tokens; "
                  f"{fig['params_before'] / 1e6:.1f}M -> {fig['params'] / 1e6:.1f}M parameters; "
                  f"{fig['size_mb_before']:.1f} -> {fig['size_mb']:.1f} MB on disk | "
                  f"dev rows over the seeds: {rows:.0f}, "
                  f"{equal:.0f} without a cut token (all predicted alike), {cut:.0f} with one ({agree:.0f} alike) |")


if __name__ == "__main__":
    main()
