"""The `champion` alias of a search's registered model (search.champion: NAME): moved to the best
configuration's model only when that configuration's mean over seeds beats the current champion's
beyond the seed spread (the larger of the two sample sds), so one lucky seed never crowns a model.

The best configuration's re-runs register their models as versions of NAME (tracking.register_as);
the first re-run's version gets the alias, and every version so judged carries its figures as tags
(search/mean, search/sd, search/objective, search/seeds) for the next search to compare against.
"""
from __future__ import annotations

import statistics

ALIAS = "champion"


def beats(mean: float, sd: float, champion_mean: float, champion_sd: float, direction: str) -> bool:
    """`mean` is better than the champion's by more than either's seed spread."""
    gain = mean - champion_mean if direction == "maximize" else champion_mean - mean
    return gain > max(sd, champion_sd)


def crown(client, name: str, run_ids: list[str], values: list[float], objective: str, direction: str) -> str:
    """Judge the best configuration's versions against the champion; the decision in a sentence."""
    from mlflow.exceptions import MlflowException

    mine = sorted((v for v in client.search_model_versions(f"name='{name}'") if v.run_id in run_ids),
                  key=lambda v: run_ids.index(v.run_id))
    if not mine:
        return f"no version of {name} registered by the best configuration's re-runs: the alias is unchanged"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    new = mine[0]
    for key, value in (("mean", repr(mean)), ("sd", repr(sd)), ("objective", objective), ("seeds", len(values))):
        client.set_model_version_tag(name, new.version, f"search/{key}", str(value))
    figure = f"{objective} {mean:.4f} ± {sd:.4f} over {len(values)} seed(s)"
    try:
        held = client.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        held = None
    if held is not None and held.version != new.version:
        tags = held.tags
        if "search/mean" not in tags or tags.get("search/objective") != objective:
            return (f"{name} v{new.version} ({figure}) not crowned: champion v{held.version} has no {objective} "
                    "mean over seeds to compare with")
        held_mean, held_sd = float(tags["search/mean"]), float(tags["search/sd"])
        if not beats(mean, sd, held_mean, held_sd, direction):
            return (f"{name} v{new.version} ({figure}) not crowned: it does not beat champion v{held.version} "
                    f"({held_mean:.4f} ± {held_sd:.4f}) beyond the seed spread")
    client.set_registered_model_alias(name, ALIAS, new.version)
    return f"{name} v{new.version} ({figure}) is the {ALIAS}" + (
        f", after v{held.version}" if held is not None and held.version != new.version else "")
