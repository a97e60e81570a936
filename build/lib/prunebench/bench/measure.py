"""The bench step of a job: the pruned model's latency, and the speedup against the dense model
measured in this process on this machine (once per model and protocol, reused by later jobs)."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.bench import semi_structured
from prunebench.models.cache import get_model
from prunebench.models.loaded import LoadedModel

_DENSE_MEDIAN: dict[str, float] = {}


def benchmark(cfg: DictConfig, loaded: LoadedModel, dense: bool, experts_per_token: float | None = None
              ) -> tuple[dict[str, float], dict[str, str]]:
    """`experts_per_token`: what the job's tasks measured under dynamic routing, for the MoE floor."""
    options = OmegaConf.to_container(cfg.bench, resolve=True)
    use_sparse = options.pop("semi_structured", False)
    bench = instantiate(options)
    tags = {}
    if use_sparse and not dense:
        why_not = semi_structured.supported(loaded.device)
        if why_not:
            tags["bench.semi_structured"] = f"not used: {why_not}"
        else:
            tags["bench.semi_structured"] = f"{semi_structured.to_semi_structured(loaded.model)} layers"
    measured = {"experts_per_token": experts_per_token} if experts_per_token else {}
    metrics, env = bench.measure(loaded, **measured)
    if measured:
        tags["bench.experts_per_token"] = f"{experts_per_token:.3g} (measured on the tasks, for latency/floor_s)"
    key = OmegaConf.to_yaml(cfg.model, resolve=True) + repr(bench.key()) + env["bench.device_name"]
    if dense:
        _DENSE_MEDIAN[key] = metrics["latency/median_s"]
    elif key not in _DENSE_MEDIAN:
        _DENSE_MEDIAN[key] = bench.measure(get_model(cfg.model))[0]["latency/median_s"]
    metrics["latency/speedup"] = _DENSE_MEDIAN[key] / metrics["latency/median_s"]
    return metrics, {**env, **tags}
