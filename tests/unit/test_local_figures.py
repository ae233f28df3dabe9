"""A rank's named figures over ranks: one all-gather, reduced by kind, names kept."""
from __future__ import annotations

import pytest

from pipeline.runtime import collectives


def rows_of(local: collectives.Figures, monkeypatch) -> list[float]:
    """The row this rank's figures put into the collective."""
    sent = []
    monkeypatch.setattr(collectives, "_all_gather_rows", lambda row: sent.append(row) or [row])
    collectives.reduce_local(local)
    return sent[0]


def reduced_over(locals_: list[collectives.Figures], monkeypatch) -> collectives.Figures:
    """What rank 0 gets back when each rank gives one of `locals_`; counts the collectives."""
    rows = [rows_of(local, monkeypatch) for local in locals_]
    calls = []
    monkeypatch.setattr(collectives, "_all_gather_rows", lambda row: calls.append(row) or rows)
    reduced = collectives.reduce_local(locals_[0])
    assert len(calls) == 1
    return reduced


def test_named_figures_are_summed_maxed_mined_and_kept_per_rank_by_name(monkeypatch):
    # the names in different insertion orders on the two ranks: packing sorts them
    a = collectives.Figures(sums={"tokens": 10.0, "samples": 2.0}, maxes={"elapsed": 3.0, "peak": 7.0},
                           mins={"free": 5.0}, per_rank=[{"joules": 1.5}])
    b = collectives.Figures(sums={"samples": 3.0, "tokens": 30.0}, maxes={"peak": 4.0, "elapsed": 9.0},
                           mins={"free": 2.0}, per_rank=[{"joules": 2.5}])
    reduced = reduced_over([a, b], monkeypatch)
    assert reduced.sums == {"samples": 5.0, "tokens": 40.0}
    assert reduced.maxes == {"elapsed": 9.0, "peak": 7.0}
    assert reduced.mins == {"free": 2.0}
    assert reduced.per_rank == [{"joules": 1.5}, {"joules": 2.5}]


def test_ranks_naming_different_figures_fail_instead_of_mixing_numbers(monkeypatch):
    a = collectives.Figures(sums={"samples": 2.0, "tokens": 1.0})
    b = collectives.Figures(sums={"samples": 2.0, "padded_tokens": 1.0})
    with pytest.raises(RuntimeError, match="different figures"):
        reduced_over([a, b], monkeypatch)
    # the same names under another kind differ too
    with pytest.raises(RuntimeError, match="different figures"):
        reduced_over([collectives.Figures(sums={"x": 1.0}), collectives.Figures(maxes={"x": 1.0})], monkeypatch)


def test_no_figures_is_no_collective(monkeypatch):
    monkeypatch.setattr(collectives, "_all_gather_rows", lambda row: pytest.fail("a collective"))
    assert collectives.reduce_local(collectives.Figures()) == collectives.Figures()


def test_joined_parts_take_their_own_figures_back_from_one_collective(monkeypatch):
    meters = [collectives.Figures(sums={"samples": 2.0}, maxes={"elapsed": 3.0}),
              collectives.Figures(sums={"samples": 4.0}, maxes={"elapsed": 1.0})]
    losses = [collectives.Figures(sums={"loss/000000": 0.5}), collectives.Figures(sums={"loss/000000": 0.25})]
    reduced = reduced_over([collectives.join(meters=m, losses=s) for m, s in zip(meters, losses)], monkeypatch)
    assert reduced.part("meters") == collectives.Figures({"samples": 6.0}, {"elapsed": 3.0}, {}, [{}, {}])
    assert reduced.part("losses").sums == {"loss/000000": 0.75}
