"""The modules a SliceGPT-sliced Llama-style decoder runs with (pruners/slicegpt.py makes them).

Slicing leaves each block's residual stream in a basis of its own and of its own width, so the
residual cannot be added as it is: each block carries the shortcut matrices that carry it from one
basis to the next (Q_in^T Q_mid before the attention's sum, Q_mid^T Q_out before the MLP's). Its
norms have had their scales folded into the linear layers they feed, and compute the RMS over the
sliced stream while dividing by the original width: the kept principal components hold almost all
of the stream's energy, so that is the unsliced norm."""

from __future__ import annotations

import torch
from torch import nn


class ScaleFreeRMSNorm(nn.Module):
    """The release's RMSN: x / sqrt(sum(x^2) / width + eps), no weight; `width` is the model's
    original hidden size whatever the sliced input's (its `mean_dim`)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.width, self.eps = width, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / self.width + self.eps)).to(dtype)

    def extra_repr(self) -> str:
        return f"width={self.width}, eps={self.eps}"


class ShortcutBlock(nn.Module):
    """A pre-norm Llama-style block (Llama, Mistral, Qwen2/3: input_layernorm, self_attn,
    post_attention_layernorm, mlp) whose two residual sums go through `attn_shortcut_Q` and
    `mlp_shortcut_Q` ([width in, width out]; None: the plain residual). It keeps the block's own
    submodules under their names, so the attention's layer index, KV cache slot and kernels are
    the model's; the block is called as the model calls its blocks (hidden states, then keywords)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.input_layernorm, self.self_attn = block.input_layernorm, block.self_attn
        self.post_attention_layernorm, self.mlp = block.post_attention_layernorm, block.mlp
        if hasattr(block, "attention_type"):  # models with sliding-window layers pick the mask by it
            self.attention_type = block.attention_type
        self.register_parameter("attn_shortcut_Q", None)
        self.register_parameter("mlp_shortcut_Q", None)

    @staticmethod
    def through(residual: torch.Tensor, shortcut: torch.Tensor | None) -> torch.Tensor:
        return residual if shortcut is None else residual @ shortcut

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        attended = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)[0]
        hidden_states = self.through(hidden_states, self.attn_shortcut_Q) + attended
        return self.through(hidden_states, self.mlp_shortcut_Q) + self.mlp(self.post_attention_layernorm(hidden_states))
