"""Scores on disk keyed by (model, scorer config, calibration config): a sweep over sparsities
scores once and applies many times, across jobs and reruns.

Teams share cache folders on clusters, so nothing here is unpickled: tensors go to a safetensors
file and the structure around them (dicts, lists, numbers, strings) to JSON beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from prunebench.cache import cache_dir, content_key


def _split(obj, tensors: dict[str, torch.Tensor]):
    """The JSON skeleton of `obj`, its tensors moved into `tensors` under generated names. Dicts
    keep their key types (int layer indices), so a round trip gives back what the scorer returned."""
    if isinstance(obj, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = obj.detach().cpu().contiguous().clone()  # safetensors refuses shared storage
        return {"tensor": name}
    if isinstance(obj, dict):
        return {"dict": [[key, _split(value, tensors)] for key, value in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {type(obj).__name__: [_split(value, tensors) for value in obj]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    raise TypeError(f"scores hold a {type(obj).__name__}; the score cache stores tensors, dicts, lists and scalars")


def _join(node, tensors: dict[str, torch.Tensor]):
    (kind, body), = node.items()
    if kind == "tensor":
        return tensors[body]
    if kind == "dict":
        return {key: _join(value, tensors) for key, value in body}
    if kind in ("list", "tuple"):
        items = [_join(value, tensors) for value in body]
        return items if kind == "list" else tuple(items)
    return body


def save_scores(scores, stem: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(scores, tensors)
    suffix = f".tmp{os.getpid()}"
    weights, layout = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    save_file(tensors, str(weights) + suffix)
    os.replace(str(weights) + suffix, weights)
    Path(str(layout) + suffix).write_text(json.dumps(skeleton))
    os.replace(str(layout) + suffix, layout)  # written last: its presence means the entry is whole


def load_scores(stem: Path):
    layout = stem.with_suffix(".json")
    if not layout.exists():
        return None
    return _join(json.loads(layout.read_text()), load_file(str(stem.with_suffix(".safetensors"))))


def cached_scores(pruner, loaded, calib, key_data: dict) -> tuple[object, bool]:
    """(scores, cache_hit). Pruners whose scoring is free (magnitude), or whose work depends on the
    sparsity and so runs in `apply` (sparsegpt, dsnot, sequential wanda), set `cacheable = False`."""
    if not pruner.cacheable:
        return pruner.score(loaded, calib), False
    stem = cache_dir("scores") / content_key(key_data)
    scores = load_scores(stem)
    if scores is not None:
        return scores, True
    scores = pruner.score(loaded, calib)
    save_scores(scores, stem)
    return scores, False
