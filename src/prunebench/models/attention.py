"""Attention heads behind one interface, whatever module holds them.

Every supported attention module ends in an output projection whose input is the heads' outputs
concatenated (`o_proj` in Llama/Gemma/Qwen/Mistral, `BertSelfOutput.dense`, timm's `proj`). A head
is therefore gated, masked or removed through that projection's input columns alone, which is
what makes the three uses (gradient scoring, masking, physical slicing) agree exactly.

A head is *inert* when its output-projection columns are all zero: it computes but contributes
nothing. Masking makes pruned heads inert; slicing removes them, except the few that must stay as
inert slots to keep the module well formed (see `slot_plan`). A trained head is never all zero,
so inertness needs no bookkeeping beyond the weights themselves."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from transformers.pytorch_utils import prune_linear_layer

from prunebench.models.introspection import tower_config, tower_modules


def head_index(heads: list[int], head_dim: int, offset: int = 0) -> torch.Tensor:
    """Row (or column) indices of the given heads in a [n_heads * head_dim] axis."""
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(offset + h * head_dim, offset + (h + 1) * head_dim) for h in heads])


def slot_plan(n_heads: int, n_kv_heads: int, pruned: set[int]) -> tuple[list[int], list[int], set[int]]:
    """(query heads kept, key/value heads kept, kept query heads that stay inert).

    Grouped-query attention repeats each key/value head for a fixed number of query heads, so
    every kept key/value head must serve the same number of query slots. A key/value head whose
    query heads are all pruned is removed with them. The other groups keep as many slots as the
    fullest one; a group with fewer survivors fills its spare slots with some of its own pruned
    heads, left inert. A layer whose heads are all pruned keeps one inert head, so the module,
    its KV cache and the model's forward stay ordinary."""
    group = n_heads // n_kv_heads
    survivors = {g: [h for h in range(g * group, (g + 1) * group) if h not in pruned] for g in range(n_kv_heads)}
    kv_kept = [g for g in range(n_kv_heads) if survivors[g]] or [0]
    slots = max(len(survivors[g]) for g in kv_kept) or 1
    q_kept, inert = [], set()
    for g in kv_kept:
        spare = [h for h in range(g * group, (g + 1) * group) if h in pruned][: slots - len(survivors[g])]
        q_kept += sorted(survivors[g] + spare)
        inert.update(spare)
    return q_kept, kv_kept, inert


class Heads:
    """The heads of one attention module. Subclasses say where the projections live."""

    reads_text = True  # its queries are the input's token positions (text, or a ViT's patches alone)

    def __init__(self, layer: int, module: nn.Module):
        self.layer, self.module = layer, module

    n_heads: int
    n_kv_heads: int
    head_dim: int

    @property
    def out_proj(self) -> nn.Linear:
        raise NotImplementedError

    def kv_of(self, head: int) -> int:
        return head // (self.n_heads // self.n_kv_heads)

    def inert(self) -> set[int]:
        cols = self.out_proj.weight.detach().reshape(self.out_proj.out_features, self.n_heads, self.head_dim)
        return {int(h) for h in torch.nonzero(cols.abs().sum(dim=(0, 2)) == 0).flatten()}

    def weight_norms(self) -> torch.Tensor:
        """L2 norm of each head's weights: its query rows, output columns and (shared) key/value rows."""
        q, k, v = (w.detach().float().reshape(-1, self.head_dim, w.shape[-1]) for w in self.qkv_weights())
        o = self.out_proj.weight.detach().float().reshape(-1, self.n_heads, self.head_dim)
        kv = k.pow(2).sum((1, 2)) + v.pow(2).sum((1, 2))
        per_head = q.pow(2).sum((1, 2)) + o.pow(2).sum((0, 2))
        return (per_head + kv[[self.kv_of(h) for h in range(self.n_heads)]]).sqrt()

    def qkv_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(linear.weight for linear in self.qkv_linears())

    def qkv_linears(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """The query, key and value projections, where they are separate layers (export pads them)."""
        raise NotImplementedError

    @torch.no_grad()
    def mask(self, pruned: set[int]) -> None:
        self.out_proj.weight[:, head_index(sorted(pruned), self.head_dim)] = 0

    @torch.no_grad()
    def remove(self, pruned: set[int]) -> None:
        """Slice the pruned heads out and rewrite the module's head counts."""
        pruned = set(pruned) | self.inert()
        q_kept, kv_kept, inert = slot_plan(self.n_heads, self.n_kv_heads, pruned)
        if len(q_kept) == self.n_heads and len(kv_kept) == self.n_kv_heads:
            self.mask(inert)
            return
        self._slice(q_kept, kv_kept)
        self.mask({q_kept.index(h) for h in inert})

    def _slice(self, q_kept: list[int], kv_kept: list[int]) -> None:
        raise NotImplementedError

    def narrow(self, n_heads: int, n_kv_heads: int) -> None:
        """The module cut to its first heads, to take weights stored at that width (models/narrow.py)."""
        self._slice(list(range(n_heads)), list(range(n_kv_heads)))

    def probe(self, sink) -> torch.utils.hooks.RemovableHandle:
        """Hook that hands this module's attention probabilities [batch, heads, query, key] to
        `sink(layer, probs)`; the probabilities exist only under `eager_attention`."""
        raise NotImplementedError


class DecoderHeads(Heads):
    """Llama/Gemma/Qwen/Mistral-style attention: q_proj, k_proj, v_proj, o_proj, grouped-query aware."""

    config_states_heads = True  # head_dim and the head counts are the config's, so sync_config can write them

    @property
    def head_dim(self) -> int:
        return self.module.head_dim

    @property
    def n_heads(self) -> int:
        return self.module.q_proj.out_features // self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.module.k_proj.out_features // self.head_dim

    @property
    def out_proj(self) -> nn.Linear:
        return self.module.o_proj

    def qkv_linears(self):
        return self.module.q_proj, self.module.k_proj, self.module.v_proj

    def _slice(self, q_kept, kv_kept):
        m, d = self.module, self.head_dim
        m.q_proj = prune_linear_layer(m.q_proj, head_index(q_kept, d), dim=0)
        m.k_proj = prune_linear_layer(m.k_proj, head_index(kv_kept, d), dim=0)
        m.v_proj = prune_linear_layer(m.v_proj, head_index(kv_kept, d), dim=0)
        m.o_proj = prune_linear_layer(m.o_proj, head_index(q_kept, d), dim=1)
        m.num_key_value_groups = len(q_kept) // len(kv_kept)
        for attr, value in (("num_heads", len(q_kept)), ("num_key_value_heads", len(kv_kept))):
            if hasattr(m, attr):
                setattr(m, attr, value)

    def probe(self, sink):
        return self.module.register_forward_hook(lambda mod, args, out: sink(self.layer, out[1]))


class VisionHeads(DecoderHeads):
    """CLIP/SigLIP-style vision attention (q_proj, k_proj, v_proj, out_proj, one key/value head per
    query head), as in a LLaVA vision tower. Its module derives its head size from the config's
    hidden size / head count, so a sliced tower's config cannot state it and stays as it was."""

    config_states_heads = False
    reads_text = False  # its queries are image patches

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads

    @property
    def out_proj(self) -> nn.Linear:
        return self.module.out_proj

    def _slice(self, q_kept, kv_kept):
        m, d = self.module, self.head_dim
        index = head_index(q_kept, d)
        m.q_proj, m.k_proj, m.v_proj = (prune_linear_layer(lin, index, dim=0) for lin in (m.q_proj, m.k_proj, m.v_proj))
        m.out_proj = prune_linear_layer(m.out_proj, index, dim=1)
        m.num_heads, m.embed_dim = len(q_kept), len(q_kept) * d


class BertHeads(Heads):
    """BERT-style self-attention (query/key/value in `.self`, the output projection in `.output.dense`)."""

    @property
    def head_dim(self) -> int:
        return self.module.self.attention_head_size

    @property
    def n_heads(self) -> int:
        return self.module.self.query.out_features // self.head_dim

    n_kv_heads = n_heads  # multi-head attention: a key/value head per query head

    @property
    def out_proj(self) -> nn.Linear:
        return self.module.output.dense

    def qkv_linears(self):
        s = self.module.self
        return s.query, s.key, s.value

    def _slice(self, q_kept, kv_kept):
        s, d = self.module.self, self.head_dim
        index = head_index(q_kept, d)
        s.query, s.key, s.value = (prune_linear_layer(lin, index, dim=0) for lin in (s.query, s.key, s.value))
        self.module.output.dense = prune_linear_layer(self.module.output.dense, index, dim=1)
        s.num_attention_heads, s.all_head_size = len(q_kept), len(q_kept) * d

    def probe(self, sink):
        return self.module.self.register_forward_hook(lambda mod, args, out: sink(self.layer, out[1]))


class TimmHeads(Heads):
    """timm's ViT attention: one fused qkv projection, `proj` as output."""

    @property
    def head_dim(self) -> int:
        return self.module.head_dim

    @property
    def n_heads(self) -> int:
        return self.module.num_heads

    n_kv_heads = n_heads  # multi-head attention: a key/value head per query head

    @property
    def out_proj(self) -> nn.Linear:
        return self.module.proj

    def qkv_weights(self):
        return self.module.qkv.weight.chunk(3, dim=0)

    def _slice(self, q_kept, kv_kept):
        m, d = self.module, self.head_dim
        m.qkv = prune_linear_layer(m.qkv, torch.cat([head_index(q_kept, d, i * m.attn_dim) for i in range(3)]), dim=0)
        if m.gate is not None:
            m.gate = prune_linear_layer(m.gate, head_index(q_kept, d), dim=0)
        m.proj = prune_linear_layer(m.proj, head_index(q_kept, d), dim=1)
        m.num_heads, m.attn_dim = len(q_kept), len(q_kept) * d

    def probe(self, sink):
        # the unfused path applies attn_drop (identity in eval) to exactly the probabilities
        return self.module.attn_drop.register_forward_hook(lambda mod, args, out: sink(self.layer, out))


def linear(obj, name: str) -> bool:
    return isinstance(getattr(obj, name, None), nn.Linear)


def heads_adapter(module: nn.Module) -> type[Heads] | None:
    if all(linear(module, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")) and hasattr(module, "head_dim"):
        return DecoderHeads
    inner = getattr(module, "self", None)
    if (inner is not None and all(linear(inner, p) for p in ("query", "key", "value"))
            and linear(getattr(module, "output", None), "dense") and not getattr(module, "is_cross_attention", False)):
        return BertHeads
    if all(linear(module, p) for p in ("q_proj", "k_proj", "v_proj", "out_proj")) and hasattr(module, "num_heads"):
        return VisionHeads
    if linear(module, "qkv") and linear(module, "proj") and all(hasattr(module, a) for a in ("num_heads", "attn_drop")):
        if not isinstance(getattr(module, "norm", nn.Identity()), nn.Identity):
            raise ValueError(f"{type(module).__name__} normalises across heads before its projection "
                             f"(scale_norm): removing a head would change the others, so it cannot be head-pruned")
        return TimmHeads
    return None


def attention_heads(model: nn.Module, tower: str = "language") -> list[Heads]:
    """The attention modules of `tower` (models/introspection.TOWERS; a model that is not a
    vision-language model is one tower) in forward order, one `Heads` per layer."""
    found = []
    for _, root in tower_modules(model, tower):
        for module in root.modules():
            adapter = heads_adapter(module)
            if adapter is not None:
                found.append(adapter(len(found), module))
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention module prunebench can head-prune in its "
                         f"{tower} tower (supported: Llama/Gemma/Qwen/Mistral-style q/k/v/o_proj, CLIP/SigLIP "
                         f"q/k/v/out_proj, BERT self-attention, timm ViT)")
    return found


def sync_config(model: nn.Module, heads: list[Heads], tower: str = "language") -> None:
    """Write the head counts into a decoder's config when every layer has the same ones, so
    `save_pretrained` / `from_pretrained` rebuild the smaller model. Layers with different counts
    (a global ranking) cannot be expressed by a transformers config, nor can BERT's or CLIP's (they
    derive the head size from hidden_size / num_attention_heads), so those configs are left as they
    were. A vision-language model's language heads go to its text config."""
    if tower == "all":
        for part in ("vision", "language"):
            sync_config(model, [h for h in heads if in_tower(model, h.module, part)], part)
        return
    config = tower_config(model, tower)
    counts = {(h.n_heads, h.n_kv_heads) for h in heads}
    if config is None or len(counts) != 1 or not all(getattr(h, "config_states_heads", False) for h in heads):
        return
    (n_heads, n_kv), = counts
    config.head_dim = heads[0].head_dim
    config.num_attention_heads, config.num_key_value_heads = n_heads, n_kv


def in_tower(model: nn.Module, module: nn.Module, tower: str) -> bool:
    return any(any(m is module for m in root.modules()) for _, root in tower_modules(model, tower))


def _gate_input(gate: torch.Tensor, head_dim: int, module, args):
    return (args[0] * gate.to(args[0].dtype).repeat_interleave(head_dim),) + tuple(args[1:])


@contextmanager
def head_gates(heads: list[Heads], requires_grad: bool = True):
    """A multiplicative gate (1.0) on every head's output; d loss / d gate is Michel et al.'s head
    importance, and setting a gate to 0 masks the head."""
    gates = [torch.ones(h.n_heads, dtype=h.out_proj.weight.dtype, device=h.out_proj.weight.device,
                        requires_grad=requires_grad) for h in heads]
    handles = [h.out_proj.register_forward_pre_hook(partial(_gate_input, g, h.head_dim)) for h, g in zip(heads, gates)]
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def eager_attention(model: nn.Module, heads: list[Heads]):
    """Attention computed with explicit matmuls and softmax: the probabilities become visible to
    hooks and to the FLOP counter (fused kernels hide both)."""
    if hasattr(model, "set_attn_implementation"):
        previous = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            yield
        finally:
            model.set_attn_implementation(previous)
        return
    fused = [(h.module, h.module.fused_attn) for h in heads if isinstance(h, TimmHeads)]
    for module, _ in fused:
        module.fused_attn = False
    try:
        yield
    finally:
        for module, flag in fused:
            module.fused_attn = flag
