"""The score cache stores what scorers return without pickle: safetensors + a JSON layout."""

from __future__ import annotations

import json

import pytest
import torch

from prunebench.pruners.score_cache import cached_scores, load_scores, save_scores


def test_round_trip_keeps_structure_key_types_and_dtypes(tmp_path):
    scores = {"his": [torch.rand(4), torch.rand(4, dtype=torch.float64)],
              "layers": {0: torch.arange(3), 7: torch.ones(2, dtype=torch.bfloat16)},
              "mop": [{"layer": 2, "ppl": 12.5, "kind": "L"}, {"layer": 3, "ppl": float("inf"), "kind": "G"}],
              "pair": (torch.zeros(1), None), "flag": True}
    save_scores(scores, tmp_path / "k")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "k.safetensors"]
    back = load_scores(tmp_path / "k")
    assert back.keys() == scores.keys() and list(back["layers"]) == [0, 7]
    assert back["mop"] == scores["mop"] and back["flag"] is True and back["pair"][1] is None
    for got, want in [*zip(back["his"], scores["his"]), *zip(back["layers"].values(), scores["layers"].values()),
                      (back["pair"][0], scores["pair"][0])]:
        assert got.dtype == want.dtype and torch.equal(got, want)
    json.loads((tmp_path / "k.json").read_text())  # plain JSON, nothing executable


def test_a_pickle_in_the_cache_folder_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path))

    class Pruner:
        cacheable = True
        calls = 0

        def score(self, loaded, calib):
            Pruner.calls += 1
            return {"w": torch.ones(2)}

    key = {"model": "m", "pruner": "p"}
    scores, hit = cached_scores(Pruner(), None, None, key)
    assert not hit and Pruner.calls == 1
    stem = next((tmp_path / "scores").glob("*.json")).with_suffix("")
    torch.save({"w": torch.zeros(2)}, stem.with_suffix(".pt"))  # what the old cache wrote: ignored
    again, hit = cached_scores(Pruner(), None, None, key)
    assert hit and Pruner.calls == 1 and torch.equal(again["w"], torch.ones(2))


def test_unsupported_objects_are_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="set"):
        save_scores({"bad": {1, 2}}, tmp_path / "k")
