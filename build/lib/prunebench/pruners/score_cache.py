"""Scores on disk keyed by (model, scorer config, calibration config): a sweep over sparsities
scores once and applies many times, across jobs and reruns."""

from __future__ import annotations

import os

import torch

from prunebench.cache import cache_dir, content_key


def cached_scores(pruner, loaded, calib, key_data: dict) -> tuple[object, bool]:
    """(scores, cache_hit). Pruners whose scoring is free (magnitude) set `cacheable = False`."""
    if not pruner.cacheable:
        return pruner.score(loaded, calib), False
    path = cache_dir("scores") / f"{content_key(key_data)}.pt"
    if path.exists():
        return torch.load(path, weights_only=False), True
    scores = pruner.score(loaded, calib)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(scores, tmp)
    tmp.replace(path)
    return scores, False
