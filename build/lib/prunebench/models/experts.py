"""Routed experts as transformers 5 stores them: fused 3-D parameters ([experts, out, in], e.g.
`mlp.experts.gate_up_proj` and `down_proj`) on an experts module, not one nn.Linear per expert.
Pruners need each expert's matrices and the latency floor needs the bytes a token reads of them."""

from __future__ import annotations

import torch


def fused_experts(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """An experts module's 3-D expert parameters (its 2-D biases stay out)."""
    n = getattr(module, "num_experts", None)
    if n is None:
        return {}
    return {name: p for name, p in module.named_parameters(recurse=False) if p.ndim == 3 and p.shape[0] == n}


def routed_top_k(model: torch.nn.Module) -> int | None:
    """The experts each token is routed to by the model's own router (config.num_experts_per_tok)."""
    config = model.config
    return getattr(getattr(config, "text_config", config), "num_experts_per_tok", None)
