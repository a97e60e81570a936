"""Unstructured and N:M pruning of the weight matrices inside the transformer blocks (Linear
weights and each routed expert's matrices, see matrices.py): magnitude, random, Wanda and SparseGPT.

Options shared by all: `modules` (attention and/or mlp projections), `skip_layers` (block indices
left dense) and `pattern` ('N:M': at most N nonzero in every M consecutive inputs of a row, in
place of a free mask at `sparsity`). Scores that do not depend on the sparsity are what `score`
returns (and the score cache keeps); `apply` turns them into masks for one sparsity."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.models.offload import onloaded
from prunebench.pruners.activations import (block_by_block, block_square_means, check_norm_sum, input_grams,
                                            input_square_means)
from prunebench.api.seeds import torch_seed
from prunebench.pruners.base import Pruner, config_value, tower_hint
from prunebench.pruners.masks import MASK_RULES, lowest, lowest_per_row, n_of_m, parse_pattern
from prunebench.pruners.matrices import Matrix, block_matrices, eager_experts
from prunebench.pruners.structured import calibration_batches

MODULES = ("attention", "mlp")
SCOPES = ("layer", "global", "row")


def module_kind(name: str) -> str:
    """A matrix under a submodule whose name mentions attn/attention is an attention projection
    (q/k/v/o in Llama, Gemma, BERT); every other matrix of a block (experts included) is MLP."""
    return "attention" if any("attn" in part or "attention" in part for part in name.split(".")) else "mlp"


class UnstructuredPruner(Pruner):
    """Masks from an importance score per weight, compared within `scope`: each layer, all layers
    together (global), or each output row; `mask_rule` picks the released code's threshold rule
    (default) or an exact count (masks.py)."""

    families = frozenset({"causal_lm", "encoder", "moe", "vlm"})

    def __init__(self, name: str, skip_layers: list[int] = (), modules: list[str] = MODULES,
                 pattern: str | None = None, scope: str = "layer", mask_rule: str = "released",
                 tower: str = "language"):
        super().__init__(name, tower)
        self.skip_layers, self.modules = set(skip_layers), list(modules)
        bad = [m for m in self.modules if m not in MODULES]
        if bad or not self.modules:
            raise ValueError(f"pruner.modules={self.modules} must be a non-empty subset of {list(MODULES)}")
        if scope not in SCOPES:
            raise ValueError(f"pruner.scope={scope!r} is not one of {list(SCOPES)}" + tower_hint(scope))
        if mask_rule not in MASK_RULES:
            raise ValueError(f"pruner.mask_rule={mask_rule!r} is not one of {list(MASK_RULES)}")
        self.pattern, self.scope, self.mask_rule = parse_pattern(pattern), scope, mask_rule
        self.onload_refusal = ("pruner.scope=global ranks every block's weights together, so all blocks would be "
                               "on the device at once; use scope=layer or row" if scope == "global" else "")

    def check(self, sparsity: float) -> None:
        if self.pattern:
            n, m = self.pattern
            if abs(sparsity - (m - n) / m) > 1e-9:
                raise ValueError(f"pruner.pattern='{n}:{m}' removes exactly {(m - n) / m:g} of the weights; "
                                 f"set sparsity={(m - n) / m:g} (or 0 for the dense baseline), not {sparsity}")

    def check_config(self, config, sparsity: float) -> None:
        check_skip_layers(self.skip_layers, config)

    def block_targets(self, prefix: str, index: int, block: torch.nn.Module) -> dict[str, Matrix]:
        """The matrices pruned in block `index` (named from the model's root, `prefix` its blocks'
        path), taken where its weights are now: inside `onloaded`, for an offloaded block."""
        if index in self.skip_layers:
            return {}
        return {f"{prefix}.{index}.{name}": m for name, m in block_matrices(block).items()
                if module_kind(name) in self.modules}

    def targets_by_block(self, model: torch.nn.Module) -> list[dict[str, Matrix]]:
        prefix, blocks = transformer_blocks(model)
        return [self.block_targets(prefix, idx, block) for idx, block in enumerate(blocks)]

    def targets(self, model: torch.nn.Module) -> dict[str, Matrix]:
        return {name: m for block in self.targets_by_block(model) for name, m in block.items()}

    def importance(self, targets: dict[str, Matrix], scores) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def masks(self, importance: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
        if self.pattern:
            return {name: n_of_m(imp, *self.pattern) for name, imp in importance.items()}
        if self.scope == "row":
            return {name: lowest_per_row(imp, sparsity) for name, imp in importance.items()}
        if self.scope == "global":
            return dict(zip(importance, lowest(list(importance.values()), sparsity, self.mask_rule)))
        return {name: lowest([imp], sparsity, self.mask_rule)[0] for name, imp in importance.items()}

    @torch.no_grad()
    def apply(self, loaded: LoadedModel, scores, sparsity: float,
              per_block: list[float] | None = None) -> dict[str, float]:
        """`per_block`: a sparsity for each block in place of `sparsity` (OWL's layerwise ratios).
        Block by block, each on its device while it is pruned (models/offload.py), except where all
        blocks' scores are ranked together (scope global without `per_block`)."""
        zeros = Zeros()
        if per_block is None and self.scope == "global":
            with onloaded(loaded.model):
                targets = self.targets(loaded.model)
                self.prune(targets, scores, sparsity)
                zeros.add(targets)
            return zeros.stats()
        prefix, blocks = transformer_blocks(loaded.model)
        ratios = [sparsity] * len(blocks) if per_block is None else per_block
        for index, block in enumerate(blocks):
            with onloaded(block):
                targets = self.block_targets(prefix, index, block)
                if targets:
                    self.prune(targets, scores, ratios[index])
                    zeros.add(targets)
        return zeros.stats()

    def prune(self, targets: dict[str, Matrix], scores, sparsity: float) -> None:
        """Zero, in place, the weights of `targets` that `scores` rank lowest at `sparsity`."""
        for name, mask in self.masks(self.importance(targets, scores), sparsity).items():
            targets[name].weight.masked_fill_(mask, 0)


def check_skip_layers(skip_layers: set[int], config) -> None:
    """A block index the model does not have would be skipped silently, so the user's intent (a
    block kept dense) would not happen; refused with the model's depth."""
    layers = config_value(config, "num_hidden_layers")
    wrong = sorted(i for i in skip_layers if layers and not 0 <= i < layers)
    if wrong:
        raise ValueError(f"pruner.skip_layers={sorted(skip_layers)}: the model has blocks 0..{layers - 1}, not {wrong}")


@contextmanager
def one_cpu_thread():
    """SparseGPT's column loop is thousands of tiny vector ops, for which intra-op threads only add
    hand-off cost: on a busy 2-core machine one Gemma 3 270M MLP projection takes 29 s with 2
    threads and 3.7 s with 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Zeros:
    """The pruned matrices' zeros and sizes, counted block by block while each block's weights are
    at hand (an offloaded block's are not, once it is written back)."""

    def __init__(self):
        self.zeros = self.total = 0

    def add(self, targets: dict[str, Matrix]) -> None:
        self.zeros += sum(int((m.weight == 0).sum()) for m in targets.values())
        self.total += sum(m.weight.numel() for m in targets.values())

    def stats(self) -> dict[str, float]:
        return {"sparsity/actual": self.zeros / self.total}


class MagnitudePruner(UnstructuredPruner):
    """|W| (the standard magnitude baseline); scope layer (default) or global."""

    cacheable = False  # its scores are the weights themselves

    def __init__(self, name: str = "magnitude", **options):
        super().__init__(name, **options)

    def importance(self, targets, scores):
        return {name: m.weight.abs() for name, m in targets.items()}


class RandomPruner(UnstructuredPruner):
    """Uniform random scores, from one generator seeded with `seed` (same seed, same masks)."""

    cacheable = False

    def __init__(self, name: str = "random", seed: int = 0, **options):
        super().__init__(name, **options)
        self.seed = torch_seed(f"pruner {name}", seed)

    def apply(self, loaded: LoadedModel, scores, sparsity: float,
              per_block: list[float] | None = None) -> dict[str, float]:
        """One generator for the whole model, drawn from block after block in the model's order."""
        self.generator = torch.Generator().manual_seed(self.seed)
        return super().apply(loaded, scores, sparsity, per_block)

    def importance(self, targets, scores):
        return {name: torch.rand(m.weight.shape, generator=self.generator) for name, m in targets.items()}


class WandaPruner(UnstructuredPruner):
    """|W_ij| x ||X_j||_2 (Sun et al. 2023), compared per output row by default.

    `sequential` (default, the released code's order: locuslab/wanda lib/prune.py prune_wanda, and
    OWL's and DSnoT's copies of it): block by block, each block's ||X_j|| measured on the outputs of
    the blocks before it, already pruned at this job's sparsity; the block is then pruned and run
    again to feed the next. Its norms thus depend on the sparsity, and nothing sparsity-free is worth
    keeping but the calibration windows, which cost a tokenisation: `score` returns the windows, the
    whole algorithm runs in `apply`, and it is not cached (`cacheable` False), so two jobs at
    different sparsities can never share its norms. `sequential=False` measures every block on the
    dense model in one forward: sparsity-free, scored once and cached for a whole ratio sweep (and
    the only way to compare all blocks at once, `scope: global`), at the cost of departing from the
    release (how far, side by side with the release: docs/unstructured.md).

    Either way ||X_j||^2 is, as the release's `scaler_row`, the mean over samples of each sample's
    sum over tokens of x_j^2, accumulated as `norm_sum` says (activations.SquareMeans: `release`, the
    release's float32 running mean, whose last bits decide ties at a row's cut; `float64`, a sum in
    float64 divided at the end, what runs did before the option), and the score is formed in
    float32 as the release's (its model-dtype weight times a float32 root). An expert's norms come from
    the tokens routed to it; an expert no calibration token reached has no norms, and falls back to |W| (magnitude)."""

    families = frozenset({"causal_lm", "moe", "vlm"})
    needs_calibration = True

    def __init__(self, name: str = "wanda", scope: str = "row", sequential: bool = True, norm_sum: str = "release",
                 **options):
        super().__init__(name, scope=scope, **options)
        self.norm_sum = check_norm_sum(norm_sum)
        if not isinstance(sequential, bool):
            raise ValueError(f"pruner.sequential={sequential!r} must be true (the release's order, block by block "
                             "through the pruned blocks) or false (norms of the dense model, one scoring per sweep)")
        if sequential and scope == "global":
            raise ValueError("pruner.scope=global ranks every block's scores together, which needs them all before "
                             "any block is pruned: set pruner.sequential=false (norms of the dense model) with it")
        self.sequential = sequential
        self.cacheable = not sequential

    def score(self, loaded: LoadedModel, calib=None) -> dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]:
        """sequential: the calibration windows; else each matrix's mean square input on the dense model."""
        samples = calibration_batches(loaded, calib, 1)
        if self.sequential:
            return samples
        with eager_experts(loaded.model):
            return input_square_means(loaded.model, self.targets(loaded.model), samples, self.norm_sum)

    @torch.no_grad()
    def apply(self, loaded: LoadedModel, scores, sparsity: float,
              per_block: list[float] | None = None) -> dict[str, float]:
        if not self.sequential:
            return super().apply(loaded, scores, sparsity, per_block)
        prefix, blocks = transformer_blocks(loaded.model)
        ratios = [sparsity] * len(blocks) if per_block is None else per_block
        zeros = Zeros()

        def prune_block(index, block, hiddens, calls):
            targets = self.block_targets(prefix, index, block)
            if targets:
                means = block_square_means(block, targets, hiddens, calls, self.norm_sum)
                self.prune(targets, means, ratios[index])
                zeros.add(targets)

        with eager_experts(loaded.model):
            block_by_block(loaded.model, scores, prune_block)
        return zeros.stats()

    def importance(self, targets, scores):
        """`scores`: each matrix's mean square input per feature (float32 or float64 as `norm_sum`
        accumulates it; all zero for an expert no token reached)."""
        out = {}
        for name, m in targets.items():
            norms = scores[name].float().sqrt() if scores[name].any() else torch.ones(m.in_features)
            out[name] = m.weight.abs().float() * norms.to(m.weight.device)[None, :]
        return out


class SparseGPTPruner(UnstructuredPruner):
    """SparseGPT (Frantar & Alistarh 2023): per layer, masks chosen by w^2 / [H^-1]_jj^2 in blocks of
    `block_size` columns, and the kept weights updated to reconstruct the layer's output on the
    calibration inputs (H = X^T X, dampened by `damp` x its mean diagonal).

    Blocks run in order, each on the outputs of the blocks already pruned, so every Hessian after
    the first depends on the sparsity: nothing sparsity-independent is worth caching beyond the
    calibration windows, and all the work happens in `apply`. An expert's Hessian comes from the
    tokens routed to it; an expert no calibration token reached gets the identity, i.e. magnitude
    pruning without an update (its all-zero Hessian would otherwise zero every weight)."""

    families = frozenset({"causal_lm", "moe", "vlm"})
    needs_calibration = True
    cacheable = False

    def __init__(self, name: str = "sparsegpt", block_size: int = 128, damp: float = 0.01, **options):
        super().__init__(name, **options)
        if self.pattern and block_size % self.pattern[1]:
            raise ValueError(f"pruner.block_size={block_size} must be a multiple of the pattern's M={self.pattern[1]}")
        if not 0 < damp:
            raise ValueError(f"pruner.damp={damp} must be positive (a fraction of the mean Hessian diagonal)")
        self.block_size, self.damp = block_size, damp

    def score(self, loaded: LoadedModel, calib=None) -> list[dict[str, torch.Tensor]]:
        return calibration_batches(loaded, calib, 1)

    def block_work_bytes(self, shapes: list[tuple[int, int]], size: int) -> int:
        """Every matrix's float64 Hessian at once (input_grams), and for the widest the Cholesky
        factors' two more and the float64 copy of its weights under update."""
        grams = [cols * cols * 8 for _, cols in shapes]
        return sum(grams) + 2 * max(grams) + max(rows * cols * 8 for rows, cols in shapes)

    @torch.no_grad()
    def apply(self, loaded: LoadedModel, samples: list[dict], sparsity: float,
              per_block: list[float] | None = None) -> dict[str, float]:
        """`per_block`: a sparsity for each block in place of `sparsity` (OWL's layerwise ratios)."""
        prefix, blocks = transformer_blocks(loaded.model)
        ratios = [sparsity] * len(blocks) if per_block is None else per_block
        zeros = Zeros()

        def prune_block(index, block, hiddens, calls):
            targets = self.block_targets(prefix, index, block)
            if targets:
                for name, gram in input_grams(block, targets, hiddens, calls).items():
                    self.reconstruct(targets[name].weight, gram, ratios[index])
                zeros.add(targets)

        with eager_experts(loaded.model):
            block_by_block(loaded.model, samples, prune_block)
        return zeros.stats()

    def reconstruct(self, weight: torch.Tensor, gram: torch.Tensor, sparsity: float) -> None:
        """Prune `weight` in place, compensating with the kept weights (SparseGPT's Algorithm 1)."""
        w = weight.detach().double().clone()
        hinv, dead = self.inverse_hessian(gram)
        w[:, dead] = 0
        mask = torch.zeros_like(w, dtype=torch.bool)
        with one_cpu_thread():
            self.lazy_block_updates(w, hinv, mask, sparsity)
        w[mask] = 0
        weight.copy_(w.to(weight.dtype))

    def inverse_hessian(self, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The upper Cholesky factor of the dampened H^-1, and the dead inputs (zero diagonal, set to 1)."""
        h = gram.clone() if gram.diagonal().any() else torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
        dead = h.diagonal() == 0
        h[dead, dead] = 1
        h.diagonal().add_(self.damp * h.diagonal().mean())
        return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True), dead

    def importance(self, targets, grams):
        """w^2 / [H^-1]_jj^2 over whole rows, before any update: the ranking DSnoT's code starts from
        (its `initial_method=sparsegpt`); `apply` ranks block by block as the weights update."""
        out = {}
        for name, m in targets.items():
            hinv, dead = self.inverse_hessian(grams[name])
            out[name] = m.weight.double().masked_fill(dead[None, :], 0) ** 2 / hinv.diagonal()[None, :] ** 2
        return out

    def lazy_block_updates(self, w: torch.Tensor, hinv: torch.Tensor, mask: torch.Tensor, sparsity: float) -> None:
        """Column by column within blocks of `block_size`, each pruned column's error spread over the
        columns after it; a block's error reaches the later blocks in one matmul. Fills `mask`, updates `w`."""
        cols = w.shape[1]
        for i1 in range(0, cols, self.block_size):
            i2 = min(i1 + self.block_size, cols)
            w1, hinv1 = w[:, i1:i2].clone(), hinv[i1:i2, i1:i2]
            d = hinv1.diagonal()
            err = torch.zeros_like(w1)
            mask1 = (torch.zeros_like(w1, dtype=torch.bool) if self.pattern else
                     lowest([w1 ** 2 / d ** 2], sparsity, self.mask_rule)[0])
            for i in range(i2 - i1):
                if self.pattern and i % self.pattern[1] == 0:
                    m = self.pattern[1]
                    mask1[:, i:i + m] = n_of_m(w1[:, i:i + m] ** 2 / d[i:i + m] ** 2, *self.pattern)
                q = w1[:, i].clone()
                q[mask1[:, i]] = 0
                err[:, i] = (w1[:, i] - q) / d[i]
                w1[:, i:] -= err[:, i:i + 1] * hinv1[i:i + 1, i:]
                w1[:, i] = q
            w[:, i1:i2] = w1
            w[:, i2:] -= err @ hinv[i1:i2, i2:]
            mask[:, i1:i2] = mask1
