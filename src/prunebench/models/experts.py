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


def expert_matrices(module: torch.nn.Module, name: str, rows: int) -> dict[str, slice]:
    """The matrices one expert's slice of fused parameter `name` holds, as row ranges of its
    [out, in] view: suffix ('' for the whole) -> rows. A gated experts module's `gate_up_proj` holds
    two, gate and up ([gate; up] by default, interleaved rows when `is_concatenated` is False, as
    transformers' experts decorator lays them out); in the unfused layout each is its own Linear,
    so a pruner comparing weights within a matrix must see them apart."""
    if name != "gate_up_proj" or not getattr(module, "has_gate", True):
        return {"": slice(None)}
    if getattr(module, "is_concatenated", True):
        return {".gate": slice(0, rows // 2), ".up": slice(rows // 2, None)}
    return {".gate": slice(0, None, 2), ".up": slice(1, None, 2)}


# Linear layers of a block that route or gate tokens rather than transform them: a `gate` or `router`
# (transformers 4 and remote code; transformers 5 keeps its routers as bare parameters) and the
# sigmoid gate of a shared expert (Qwen2-MoE, Qwen3-Next: hidden -> 1).
ROUTER_LINEARS = frozenset({"gate", "router", "shared_expert_gate"})


def is_router(module_name: str) -> bool:
    """Whether the Linear at `module_name` is a router, which pruners leave dense as the papers do."""
    return module_name.rsplit(".", 1)[-1] in ROUTER_LINEARS


def routed_top_k(model: torch.nn.Module) -> int | None:
    """The experts each token is routed to by the model's own router (config.num_experts_per_tok)."""
    config = model.config
    return getattr(getattr(config, "text_config", config), "num_experts_per_tok", None)
