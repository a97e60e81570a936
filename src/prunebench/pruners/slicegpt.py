"""SliceGPT (Ashkboos et al., ICLR 2024; released code microsoft/TransformerCompression): the
embedding dimension sliced. Sparsity is the fraction of the hidden size removed.

The norms' scales are folded into the linear layers they feed, which leaves scale-free RMS norms
that commute with any rotation of the residual stream. Each residual stream (the embeddings', and
in every block the one between attention and MLP and the one leaving the block) is then rotated
onto the principal axes of its calibration signals and only the leading `width` axes are kept.
Blocks are processed in order, each on the signals coming out of the blocks already sliced
(`rotate_and_slice_sequential`), and the residual path of every block goes through the shortcut
matrices that carry one stream's basis into the next (models/sliced.py)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from prunebench.models.introspection import tower_config, transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.models.sliced import ScaleFreeRMSNorm, ShortcutBlock
from prunebench.pruners.activations import block_calls, run_block
from prunebench.pruners.base import config_value
from prunebench.pruners.structured import StructuredPruner, calibration_batches

log = logging.getLogger(__name__)

ATTENTION_INPUTS, MLP_INPUTS = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
LINEARS = {"self_attn": (*ATTENTION_INPUTS, "o_proj"), "mlp": (*MLP_INPUTS, "down_proj")}
BLOCK_NORMS = ["input_layernorm", "post_attention_layernorm"]
POST_NORMS = ("Gemma 2 and 3 normalise the attention's and the MLP's outputs with scaled RMS norms before the residual "
              "sum (post_attention_layernorm, post_feedforward_layernorm): a per-feature scale on the residual path "
              "does not commute with a rotation of the stream, so SliceGPT's rotation would change what the model "
              "computes (its release covers OPT, Llama and Phi)")

REFUSED_MODEL_TYPES = ("gemma2", "gemma3", "gemma3_text")


def sliced_width(hidden: int, sparsity: float, round_interval: int) -> int:
    """The release's new embedding dimension: int((1 - sparsity) * hidden), rounded down to a
    multiple of `round_interval`."""
    width = int((1 - sparsity) * hidden)
    width -= width % round_interval
    if width < 1:
        raise ValueError(f"sparsity={sparsity} leaves no dimension of hidden_size={hidden} at round_interval={round_interval}")
    return width


def warn_thin_calibration(samples: list[dict], width: int) -> None:
    """The first PCA is taken on token embeddings, so its rank is at most the number of distinct
    calibration tokens; with fewer than the kept width, the cut falls among equal (zero) eigenvalues
    and which directions survive is decided by rounding, not by the data."""
    ids = [batch["input_ids"][batch["attention_mask"].bool()] if "attention_mask" in batch else batch["input_ids"]
           for batch in samples]
    distinct = int(torch.cat([i.flatten().cpu() for i in ids]).unique().numel())
    if distinct < width:
        log.warning("SliceGPT keeps %d dimensions, but the calibration holds %d distinct tokens, so the first "
                    "PCA has at most %d nonzero eigenvalues and the directions kept past them are chosen by "
                    "rounding; calibrate on more text (the release: 128 windows of 2048 tokens, calib=wikitext2)",
                    width, distinct, distinct)


def norm_eps(norm: nn.Module) -> float | None:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


@torch.no_grad()
def scales_plain_rms(norm: nn.Module) -> bool:
    """Whether `norm` computes weight * x / sqrt(mean(x^2) + eps), Llama's RMSNorm, whose weight
    folds into the next linear layer (Gemma's computes (1 + weight) * ..., which does not)."""
    weight, eps = getattr(norm, "weight", None), norm_eps(norm)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        return False
    x = torch.randn(2, weight.numel(), generator=torch.Generator().manual_seed(0)).to(weight.device)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(weight.dtype)
    return torch.allclose(norm(x.to(weight.dtype)).float(), expected.float(), rtol=1e-3, atol=1e-3)


def check_llama_like(model: nn.Module) -> None:
    """Refuse, naming what differs, a model whose blocks are not pre-norm Llama blocks with two
    foldable norms and separate q/k/v/o and gate/up/down projections: the only shape whose
    rotation and shortcut matrices models/sliced.ShortcutBlock implements."""
    _, blocks = transformer_blocks(model)
    for index, block in enumerate(blocks):
        for part, names in LINEARS.items():
            missing = [n for n in names if not isinstance(getattr(getattr(block, part, None), n, None), nn.Linear)]
            if missing:
                raise ValueError(f"SliceGPT: block {index} ({type(block).__name__}) has no {part}.{missing[0]} linear "
                                 f"layer; it slices Llama-style blocks (q/k/v/o_proj, gate/up/down_proj)")
        norms = sorted(name for name, m in block.named_modules()
                       if "norm" in type(m).__name__.lower() and not name.startswith("self_attn."))
        if norms != BLOCK_NORMS:
            raise ValueError(f"SliceGPT: block {index} ({type(block).__name__}) has the norms {norms}, not only "
                             f"{BLOCK_NORMS}; {POST_NORMS}")
    for norm in [m for b in blocks for m in (b.input_layernorm, b.post_attention_layernorm)] + [model.get_decoder().norm]:
        if not scales_plain_rms(norm):
            raise ValueError(f"SliceGPT: {type(norm).__name__} does not compute weight * x / rms(x) (Llama's RMSNorm), "
                             f"so its scale cannot be folded into the next linear layer")


def fold_scale(norm: nn.Module, linears: list[nn.Linear]) -> None:
    """The release's fuse_ln_linear for an RMS norm: the next layers' columns times its weight (float64)."""
    for linear in linears:
        linear.weight.data = (linear.weight.double() * norm.weight.double()).to(linear.weight.dtype)


@torch.no_grad()
def fuse_norms(model: nn.Module) -> None:
    """The release's fuse_modules for Llama: LM head untied from the embeddings, embedding rows
    mean-centred (which RMSNorm, unlike LayerNorm, does not undo: the release does it for every
    model), every norm's scale folded into the layers it feeds and the norm replaced by the
    scale-free ScaleFreeRMSNorm over the original width."""
    decoder, head, embed = model.get_decoder(), model.get_output_embeddings(), model.get_input_embeddings()
    hidden = tower_config(model, "language").hidden_size
    if head.weight is embed.weight:
        head.weight = nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    rows = embed.weight.double()
    embed.weight.data = (rows - rows.mean(-1, keepdim=True)).to(embed.weight.dtype)
    _, blocks = transformer_blocks(model)
    for block in blocks:
        fold_scale(block.input_layernorm, [getattr(block.self_attn, n) for n in ATTENTION_INPUTS])
        fold_scale(block.post_attention_layernorm, [getattr(block.mlp, n) for n in MLP_INPUTS])
        block.input_layernorm = ScaleFreeRMSNorm(hidden, norm_eps(block.input_layernorm))
        block.post_attention_layernorm = ScaleFreeRMSNorm(hidden, norm_eps(block.post_attention_layernorm))
    fold_scale(decoder.norm, [head])
    decoder.norm = ScaleFreeRMSNorm(hidden, norm_eps(decoder.norm))


def add_gram(gram: torch.Tensor | None, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """gram + X^T X in float64 over the signal's tokens; padded positions (mask 0) count as zeros,
    as the release's `ignore_masks` zero them."""
    x = x.double().reshape(-1, x.shape[-1])
    if mask is not None:
        x = x * mask.reshape(-1, 1).to(x)
    return x.T @ x if gram is None else gram + x.T @ x


def principal_axes(gram: torch.Tensor, damp: float) -> torch.Tensor:
    """The release's pca_calc: eigenvectors (columns) of X^T X + damp * mean(diag) * I, by
    descending eigenvalue."""
    gram = gram.clone()
    gram.diagonal().add_(damp * gram.diagonal().mean())
    values, vectors = torch.linalg.eigh(gram)
    return vectors[:, torch.argsort(values, descending=True)]


def rotate_inputs(linear: nn.Module, q: torch.Tensor, width: int) -> None:
    """Columns (the input features, or an embedding's features) into the basis q, the first `width` kept."""
    linear.weight.data = (linear.weight.double() @ q)[:, :width].to(linear.weight.dtype).contiguous()
    if isinstance(linear, nn.Linear):
        linear.in_features = width
    else:
        linear.embedding_dim = width


def rotate_outputs(linear: nn.Linear, q: torch.Tensor, width: int) -> None:
    """Rows (the output features and bias) into the basis q, the first `width` kept."""
    dtype = linear.weight.dtype
    linear.weight.data = (q.T @ linear.weight.double())[:width].to(dtype).contiguous()
    if linear.bias is not None:
        linear.bias.data = (q.T @ linear.bias.double())[:width].to(dtype)
    linear.out_features = width


def set_shortcut(block: ShortcutBlock, name: str, matrix: torch.Tensor) -> None:
    setattr(block, name, nn.Parameter(matrix.contiguous(), requires_grad=False))


@torch.no_grad()
def block_signals(block: ShortcutBlock, hiddens: list[torch.Tensor], calls: list[tuple],
                  masks: list[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The Gram matrix of the stream between attention and MLP (the post-attention norm's input)
    and the block's outputs, the block run on every calibration batch (the release's get_signals)."""
    gram, mask, outs = None, None, []

    def observe(module, args):
        nonlocal gram
        gram = add_gram(gram, args[0], mask)

    hook = block.post_attention_layernorm.register_forward_pre_hook(observe)
    try:
        for hidden, call, mask in zip(hiddens, calls, masks):
            outs.append(run_block(block, hidden, call))
    finally:
        hook.remove()
    return gram, outs


@torch.no_grad()
def rotate_and_slice(model: nn.Module, samples: list[dict], width: int, damp: float) -> None:
    """The release's rotate_and_slice_sequential (ConstSlicingScheduler, final_orientation=pca, the
    head not sliced): on a model whose norms are fused (fuse_norms), every block replaced by a
    ShortcutBlock and rotated and sliced in turn, each PCA taken on the signals of the blocks before
    it already sliced. The last block's output stays at the full width, which the head reads."""
    hidden = tower_config(model, "language").hidden_size
    dtype = model.get_input_embeddings().weight.dtype
    _, blocks = transformer_blocks(model)
    masks = [batch.get("attention_mask") for batch in samples]
    hiddens, calls = block_calls(model, samples)

    def gram_of(signals):
        gram = None
        for signal, mask in zip(signals, masks):
            gram = add_gram(gram, signal, mask)
        return gram

    q = principal_axes(gram_of(hiddens), damp)
    rotate_inputs(model.get_input_embeddings(), q, width)
    for index in range(len(blocks)):
        block = blocks[index] = ShortcutBlock(blocks[index])
        out_width = hidden if index == len(blocks) - 1 else width
        # the stream entering the block, in the previous basis and width; its shortcut first leads
        # back to the original basis, for the signals, then on into the next basis (in the model's
        # dtype, as the release multiplies them)
        for name in ATTENTION_INPUTS:
            rotate_inputs(getattr(block.self_attn, name), q, width)
        set_shortcut(block, "attn_shortcut_Q", q.T[:width].to(dtype))
        hiddens = [(h @ q.to(h.dtype))[..., :width] for h in hiddens]
        gram, _ = block_signals(block, hiddens, calls[index], masks)
        q = principal_axes(gram, damp)
        set_shortcut(block, "attn_shortcut_Q", block.attn_shortcut_Q @ q[:, :width].to(dtype))
        rotate_outputs(block.self_attn.o_proj, q, width)
        for name in MLP_INPUTS:
            rotate_inputs(getattr(block.mlp, name), q, width)
        set_shortcut(block, "mlp_shortcut_Q", q.T[:width].to(dtype))
        _, hiddens = block_signals(block, hiddens, calls[index], masks)
        q = principal_axes(gram_of(hiddens), damp)
        set_shortcut(block, "mlp_shortcut_Q", block.mlp_shortcut_Q @ q[:, :out_width].to(dtype))
        rotate_outputs(block.mlp.down_proj, q, out_width)
    rotate_inputs(model.get_output_embeddings(), q, hidden)


class SliceGPTPruner(StructuredPruner):
    """`slicegpt`: sparsity = the fraction of the hidden size sliced away (rounded so the new width
    is a multiple of `round_interval`); `sparsity/actual` is the width's achieved fraction.

    Calibration drives every rotation, and each block's rotation depends on the width the blocks
    before it were sliced to, so nothing sparsity-independent is worth caching: `score` returns
    the calibration batches and `apply` does the work (as SparseGPT's)."""

    families = frozenset({"causal_lm"})
    needs_calibration = True
    onload_refusal = "it rotates and slices the embeddings, every block and the head in one pass over the model"
    cacheable = False
    exportable = False
    export_refusal = ("slices the hidden size with a shortcut matrix on every block's residual path, which no "
                      "transformers config can state, so no Hugging Face folder would load it as it ran")

    def __init__(self, name: str = "slicegpt", batch_size: int = 16, round_interval: int = 8, damp: float = 0.01,
                 tower: str = "language"):
        super().__init__(name, tower)
        if round_interval < 1 or damp < 0:
            raise ValueError(f"round_interval={round_interval} must be >= 1 and damp={damp} >= 0")
        self.batch_size, self.round_interval, self.damp = batch_size, round_interval, damp

    def check_config(self, config, sparsity: float) -> None:
        """Gemma 2 and 3 refused by their model_type before they load (check_llama_like refuses any
        other block it cannot slice once the model has loaded)."""
        model_type = config_value(config, "model_type")
        if model_type in REFUSED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r}: {POST_NORMS}")
        hidden = config_value(config, "hidden_size")
        if hidden:
            sliced_width(hidden, sparsity, self.round_interval)  # a ratio that leaves no dimension

    def score(self, loaded: LoadedModel, calib=None) -> list[dict[str, torch.Tensor]]:
        return calibration_batches(loaded, calib, self.batch_size)

    def prune(self, loaded: LoadedModel, samples: list[dict], sparsity: float) -> dict[str, float]:
        check_llama_like(loaded.model)
        hidden = tower_config(loaded.model, "language").hidden_size
        width = sliced_width(hidden, sparsity, self.round_interval)
        warn_thin_calibration(samples, width)
        fuse_norms(loaded.model)
        rotate_and_slice(loaded.model, samples, width, self.damp)
        return {"sparsity/actual": 1 - width / hidden}
