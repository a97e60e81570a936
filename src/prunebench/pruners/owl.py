"""OWL, outlier-weighted layerwise sparsity (Yin et al., ICML 2024): each block gets its own
sparsity, lower where more of its Wanda scores are outliers, the mean held at the target; a base
pruner (Wanda, SparseGPT or magnitude) then prunes each block at its own sparsity.

As the released code (luuyin/OWL, lib/prune_all.py) computes it, for each block l:
  D_l = 100 x #{A > M x mean(A)} / #A over A = |W_ij| x ||X_j||_2 of all the block's matrices together,
        X measured on the dense model (the outlier pass prunes nothing);
  d_l = (D_l - min D) / (max D - min D) x 2 lambda - mean_l(...) + (1 - sparsity)   (a density);
  s_l = 1 - d_l, and s_l <= 0 becomes 0.01.
The outlier pass runs on the dense model in the release too (it prunes nothing); its pruning pass
then runs the base block by block through the blocks already pruned, Wanda's norms included
(`sequential`, default). The scores (the dense model's activation norms, the outlier ratios and the
calibration windows the pruning pass replays) depend on neither lambda, the base, `sequential` nor
the sparsity: one scoring serves them all."""

from __future__ import annotations

import numpy as np
import torch

from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.models.offload import onloaded
from prunebench.pruners.activations import check_norm_sum, input_square_means
from prunebench.pruners.base import Pruner, config_value
from prunebench.pruners.matrices import Matrix, block_matrices
from prunebench.pruners.structured import calibration_batches
from prunebench.pruners.unstructured import (MODULES, MagnitudePruner, SparseGPTPruner, WandaPruner,
                                             check_skip_layers, module_kind)

# base -> (its class, which part of OWL's scores it prunes from; a sequential wanda, the samples)
BASES = {"wanda": (WandaPruner, "norms"), "sparsegpt": (SparseGPTPruner, "samples"),
         "magnitude": (MagnitudePruner, None)}
# what OWL itself sets on the base
OWNED = ("modules", "skip_layers", "tower", "pattern", "sequential", "norm_sum")
# the released code's floor for a block whose computed sparsity is not positive
FLOOR = 0.01


def outlier_ratio(metric: torch.Tensor, m: float) -> float:
    """Percent of `metric` above m times its mean (the release's check_outlier_mean)."""
    return float((metric > metric.mean() * m).sum()) / metric.numel() * 100


def block_outlier_ratio(block: dict[str, Matrix], norms: dict[str, torch.Tensor], m: float) -> float:
    """A pruned block's outlier ratio, on float32 Wanda scores as the release forms them (its fp16
    weights times the root of a float32 mean square over samples); `norms`: the mean squares."""
    scores = [(mat.weight.detach().abs().float().cpu() * norms[name].float().cpu().sqrt()[None, :])
              .flatten() for name, mat in block.items()]
    return outlier_ratio(torch.cat(scores), m)


def layer_sparsities(ratios: list[float], sparsity: float, lamda: float) -> list[float]:
    """The release's arithmetic in its order (numpy float64), so floor(n x s_l) counts match. Equal
    ratios, where the release divides 0 by 0, give every block the target."""
    if not ratios or max(ratios) == min(ratios):
        return [sparsity] * len(ratios)
    d = np.array(ratios, dtype=np.float64)
    d = (d - d.min()) * (1 / (d.max() - d.min()) * lamda * 2)
    d = d - np.mean(d) + (1 - sparsity)
    out = [float(1 - density) for density in d]
    if max(out) > 1:
        raise ValueError(f"OWL gives block {out.index(max(out))} a sparsity of {max(out):.4f} > 1 at "
                         f"sparsity={sparsity}: lower pruner.lamda (now {lamda})")
    return [s if s > 0 else FLOOR for s in out]


class OWLPruner(Pruner):
    """A base pruner (`base`: wanda, sparsegpt or magnitude, built with `base_options`) applied at
    OWL's per-block sparsities. `norm_sum` is how ||X_j||^2 is accumulated (activations.SquareMeans),
    in the outlier pass and the wanda base's norms alike. `sequential` is the wanda base's (true: its
    norms through the blocks already pruned, the release's pruning pass; false: the outlier pass's
    dense norms); sparsegpt
    always runs block by block and magnitude measures nothing, so both refuse false. Dense causal LMs
    and a VLM's language model: the release defines the outlier ratio for dense blocks, and an
    expert's norms would rest on its own token count."""

    families = frozenset({"causal_lm", "vlm"})
    needs_calibration = True
    unscored = frozenset({"name", "base", "base_options", "lamda", "sequential"})

    def block_work_bytes(self, shapes: list[tuple[int, int]], size: int) -> int:
        return self.base.block_work_bytes(shapes, size)

    def __init__(self, name: str = "owl", base: str = "wanda", m: float = 5.0, lamda: float = 0.08,
                 base_options: dict | None = None, modules: list[str] = MODULES, skip_layers: list[int] = (),
                 tower: str = "language", sequential: bool = True, norm_sum: str = "release"):
        super().__init__(name, tower)
        self.norm_sum = check_norm_sum(norm_sum)
        if base not in BASES:
            raise ValueError(f"pruner.base={base!r} is not one of {list(BASES)}")
        if not m > 0:
            raise ValueError(f"pruner.m={m} must be positive (a score above m x the block's mean is an outlier)")
        if not 0 <= lamda:
            raise ValueError(f"pruner.lamda={lamda} must not be negative (block sparsities span about target +- lamda)")
        options = dict(base_options or {})
        if options.get("pattern") is not None:
            raise ValueError("OWL sets one sparsity per block, which an N:M pattern fixes: the release's wanda_owl "
                             "with N:M prunes every block N:M alike (pruner=wanda pruner.pattern=...)")
        owned = sorted(set(options) & set(OWNED))
        if owned:
            raise ValueError(f"pruner.base_options sets {owned}; set them on pruner (OWL passes them to its base)")
        if base == "wanda":
            options.update(sequential=sequential, norm_sum=norm_sum)
        elif sequential is not True:
            raise ValueError(f"pruner.sequential={sequential!r} chooses where the wanda base measures its norms; "
                             f"base={base!r} {'measures no inputs' if base == 'magnitude' else 'always runs block by block'}"
                             ": leave pruner.sequential=true")
        cls, self.base_scores = BASES[base]
        self.base = cls(modules=modules, skip_layers=skip_layers, tower=tower, **options)
        self.onload_refusal = self.base.onload_refusal
        if getattr(self.base, "sequential", False):
            self.base_scores = "samples"
        self.m, self.lamda, self.modules = float(m), float(lamda), list(modules)

    def check_config(self, config, sparsity: float) -> None:
        """OWL's spread needs only the number of pruned blocks n: the block with the fewest outliers gets
        sparsity + mean of the others' 2 lamda-scaled positions, at least sparsity + 2 lamda / n (one
        block at the top, the rest at the bottom). Past 1 there, no outlier ratios can save the run."""
        check_skip_layers(self.base.skip_layers, config)
        layers = config_value(config, "num_hidden_layers")
        n = (layers or 0) - len(self.base.skip_layers)
        if n > 1 and sparsity + 2 * self.lamda / n > 1:
            raise ValueError(f"pruner.lamda={self.lamda} at sparsity={sparsity} over {n} pruned blocks gives the "
                             f"block with the fewest outliers a sparsity of at least {sparsity + 2 * self.lamda / n:.4f} "
                             f"> 1; lower lamda below {(1 - sparsity) * n / 2:.4g}")

    def score(self, loaded: LoadedModel, calib=None) -> dict:
        samples = calibration_batches(loaded, calib, 1)
        norms = input_square_means(loaded.model, self.base.targets(loaded.model), samples, self.norm_sum)
        prefix, blocks = transformer_blocks(loaded.model)
        outliers = {}
        for index, block in enumerate(blocks):
            with onloaded(block, edits=False):
                targets = self.base.block_targets(prefix, index, block)
                if targets:
                    outliers[index] = block_outlier_ratio(targets, norms, self.m)
        return {"samples": samples, "norms": norms, "outliers": outliers}

    def block_sparsities(self, outliers: dict[int, float], n_blocks: int, sparsity: float) -> list[float]:
        """One sparsity per block, the skipped blocks' 0."""
        ratios = dict(zip(outliers, layer_sparsities(list(outliers.values()), sparsity, self.lamda)))
        return [ratios.get(index, 0.0) for index in range(n_blocks)]

    @torch.no_grad()
    def apply(self, loaded: LoadedModel, scores: dict, sparsity: float) -> dict[str, float]:
        _, blocks = transformer_blocks(loaded.model)
        per_block = self.block_sparsities(scores["outliers"], len(blocks), sparsity)
        base_scores = scores[self.base_scores] if self.base_scores else None
        if self.base_scores == "samples":  # the score cache gives them back on the CPU
            base_scores = [{k: v.to(loaded.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                           for batch in base_scores]
        stats = self.base.apply(loaded, base_scores, sparsity, per_block=per_block)
        for index, block in enumerate(blocks):
            with onloaded(block, edits=False):
                weights = [mat.weight for name, mat in block_matrices(block).items() if module_kind(name) in self.modules]
                zeros = sum(int((w == 0).sum()) for w in weights)
            stats[f"sparsity/layer_{index}"] = zeros / sum(w.numel() for w in weights)
        stats.update({f"outliers/layer_{index}": ratio for index, ratio in scores["outliers"].items()})
        return stats
