"""The weight matrices unstructured pruners prune, and how their inputs are observed.

A block's matrices are its Linear weights and, in mixture-of-experts blocks, every routed expert's
own matrices, slices of the fused expert parameters (models/experts.py) that no `nn.Linear` holds:
a pruner looking for Linears alone never touched them (5.5% of tiny-mixtral's block weights zeroed
at sparsity 0.5). A fused gate/up slice gives two matrices, gate and up, as the unfused layout
has (pruned as one, each half landed at 47.9-52.1% under magnitude at 0.5). Each is a view, so
masking it in place prunes the model. Routers, the shared expert's gate included, stay out."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from prunebench.models.experts import expert_matrices, fused_experts, is_router


@dataclass(frozen=True, eq=False)
class Matrix:
    """One prunable [out, in] matrix: a Linear's weight, or (part of) expert `expert` of a fused parameter."""

    weight: torch.Tensor
    linear: torch.nn.Linear | None = None
    fused: torch.nn.Parameter | None = None
    expert: int | None = None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]


def block_matrices(block: torch.nn.Module) -> dict[str, Matrix]:
    """Name (relative to the block; an expert slice ends in `.<expert>`, a fused gate/up one in
    `.<expert>.gate` and `.<expert>.up`) -> Matrix."""
    out = {}
    for mod_name, module in block.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(module, torch.nn.Linear) and not is_router(mod_name):
            out[mod_name] = Matrix(module.weight, linear=module)
        for p_name, param in fused_experts(module).items():
            transposed = getattr(module, "is_transposed", False)  # stored [experts, in, out]
            for e in range(param.shape[0]):
                whole = param[e].T if transposed else param[e]
                for suffix, rows in expert_matrices(module, p_name, whole.shape[0]).items():
                    out[f"{prefix}{p_name}.{e}{suffix}"] = Matrix(whole[rows], fused=param, expert=e)
    return out


@contextmanager
def eager_experts(model: torch.nn.Module):
    """The experts' own per-expert loop (transformers' "eager" implementation), the one that calls
    F.linear on each expert's slice and so lets `input_hooks` see each expert's routed tokens."""
    if not hasattr(model, "set_experts_implementation") or not any(
            fused_experts(m) for m in model.modules()):
        yield
        return
    saved = model.get_experts_implementation()
    model.set_experts_implementation("eager")
    try:
        yield
    finally:
        model.set_experts_implementation(saved)


@contextmanager
def input_hooks(matrices: dict[str, Matrix], observe):
    """Calls observe(name, x) with each matrix's input, flattened to [tokens, in_features]: a
    Linear's through a forward pre-hook; an expert's by watching F.linear for a weight that is that
    expert's slice of its fused parameter (its routed tokens only; run under `eager_experts`). The
    gate and up matrices of one slice both see that slice's input."""
    handles = [m.linear.register_forward_pre_hook(lambda mod, args, name=name: observe(name, args[0].flatten(0, -2)))
               for name, m in matrices.items() if m.linear is not None]
    # the experts' loop hands F.linear the view `fused[e]`, found by where it starts
    slices: dict[int, list[str]] = {}
    for name, m in matrices.items():
        if m.fused is not None:
            slices.setdefault(m.fused[m.expert].data_ptr(), []).append(name)
    original = torch.nn.functional.linear

    def linear(x, weight, bias=None):
        for name in slices.get(weight.data_ptr(), ()):
            observe(name, x.flatten(0, -2))
        return original(x, weight, bias)

    if slices:
        torch.nn.functional.linear = linear
    try:
        yield
    finally:
        torch.nn.functional.linear = original
        for handle in handles:
            handle.remove()
