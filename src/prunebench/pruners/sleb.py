"""SLEB (Song et al., ICML 2024): whole blocks removed greedily, one per round, each round the block
whose removal leaves the lowest calibration loss (sum of next-token NLLs, i.e. perplexity), judged
on the model with the earlier rounds' blocks already gone. Neighbouring blocks are often redundant
with each other, so a one-shot ranking would remove both of a pair; re-evaluating after each
removal keeps one.

The released loop runs the whole model once per candidate. Here every candidate starts where its
removal takes effect: within a round, the hidden state entering each remaining block is computed
once per calibration sample, and skipping block k means running the blocks after it from the
state that entered it. The selection is the same (tests/pruners/test_sleb.py runs the released loop beside
it); the work per round is about halved (docs/structured.md, "SLEB")."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.activations import block_calls, forwards_replaced, run_block
from prunebench.pruners.base import config_value
from prunebench.pruners.layers import LayerPruner
from prunebench.pruners.structured import calibration_batches, observe


@torch.no_grad()
def after_blocks(model, batch: dict, hidden: torch.Tensor) -> torch.Tensor:
    """The decoder's output when its last block emits `hidden`: whatever the family does after
    its blocks (final norm, projection) runs as in its own forward, because every block is made to
    return `hidden`. What precedes the blocks (embeddings, masks) is cheap beside them."""
    _, blocks = transformer_blocks(model)
    with forwards_replaced(blocks, lambda index: lambda *args, **kwargs: hidden):
        return observe(model, {**batch, "use_cache": False}).last_hidden_state


def nll_sum(loaded: LoadedModel, batch: dict, hidden: torch.Tensor) -> float:
    """Summed next-token NLL of the batch's windows given the last block's output, in fp32."""
    logits = loaded.lm_logits(after_blocks(loaded.model, batch, hidden))[:, :-1].float()
    ids = batch["input_ids"][:, 1:]
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="sum"))


@torch.no_grad()
def candidate_losses(loaded: LoadedModel, batch: dict, first: torch.Tensor, calls: list[tuple],
                     alive: list[int], candidates: range) -> list[float]:
    """For each position k in `candidates` of the remaining blocks `alive`: the batch's NLL with
    block alive[k] skipped. `calls[i]`: block i's other arguments for this batch (block_calls)."""
    _, blocks = transformer_blocks(loaded.model)
    entering = [first]  # entering[k]: the hidden state entering alive[k] in the current model
    for i in alive[:candidates.stop - 1]:
        entering.append(run_block(blocks[i], entering[-1], calls[i]))
    losses = []
    for k in candidates:
        hidden = entering[k]
        for i in alive[k + 1:]:
            hidden = run_block(blocks[i], hidden, calls[i])
        losses.append(nll_sum(loaded, batch, hidden))
    return losses


def greedy_order(loaded: LoadedModel, batches: list[dict], n: int, early: int = 1, latter: int = 1
                 ) -> tuple[list[int], list[float]]:
    """The first `n` blocks SLEB removes, in order, and the calibration NLL after each removal.

    As the release: candidates are the remaining blocks but the first `early` and the last
    `latter` of them; the lowest summed loss wins, the earliest candidate on a tie."""
    n_layers = len(transformer_blocks(loaded.model)[1])
    if n > n_layers - early - latter:
        raise ValueError(f"SLEB can remove at most {n_layers - early - latter} of {n_layers} blocks with "
                         f"early_barrier={early} and latter_barrier={latter}; {n} asked")
    firsts, calls = block_calls(loaded.model, batches)
    alive, order, best = list(range(n_layers)), [], []
    for _ in range(n):
        candidates = range(early, len(alive) - latter)
        totals = [0.0] * len(candidates)
        for s, batch in enumerate(batches):
            losses = candidate_losses(loaded, batch, firsts[s], [per_block[s] for per_block in calls],
                                      alive, candidates)
            totals = [t + loss for t, loss in zip(totals, losses)]
        k = min(range(len(totals)), key=totals.__getitem__)  # the first of equal minima, as the release's strict <
        order.append(alive.pop(candidates[k]))
        best.append(totals[k])
    return order, best


class SLEBPruner(LayerPruner):
    """Scores the greedy order once per model and calibration set, up to `max_fraction` of the
    blocks. The order for n blocks is the first n of the order for more (each round depends only on
    the rounds before it), so one scoring serves every sparsity up to `max_fraction`, and a sweep
    over 20/30/50% scores once (pruners/score_cache.py) instead of re-running the early rounds for
    each. Scoring further than a job needs costs the later rounds, which are the cheaper ones (fewer
    blocks left, fewer candidates): max_fraction=0.5 costs about 1.8x what 0.2 alone would.

    Causal LMs only: dense text decoders are what the release runs (OPT, Llama) and what the
    conformance test covers (Llama, Gemma 3); vision-language and MoE models are refused rather
    than pruned by a loop nobody has checked on them."""

    families = frozenset({"causal_lm"})
    needs_calibration = True
    onload_refusal = ""

    def __init__(self, name: str = "sleb", max_fraction: float = 0.5, early_barrier: int = 1,
                 latter_barrier: int = 1, tower: str = "language"):
        super().__init__(name, tower)
        if not 0.0 < max_fraction < 1.0:
            raise ValueError(f"max_fraction={max_fraction} must be in (0, 1)")
        if early_barrier < 0 or latter_barrier < 0:
            raise ValueError(f"early_barrier={early_barrier} and latter_barrier={latter_barrier} must be >= 0")
        self.max_fraction, self.early, self.latter = max_fraction, early_barrier, latter_barrier

    def check(self, sparsity: float) -> None:
        if sparsity > self.max_fraction:
            raise ValueError(f"sparsity={sparsity} is above pruner.max_fraction={self.max_fraction}, the share of "
                             f"blocks whose removal order is scored; raise pruner.max_fraction")

    def check_config(self, config, sparsity: float) -> None:
        """The barriers keep blocks: refuse, before the model loads, a sparsity that would need them."""
        layers = config_value(config, "num_hidden_layers")
        if layers and self.count(layers, sparsity) > layers - self.early - self.latter:
            raise ValueError(f"sparsity={sparsity} removes {self.count(layers, sparsity)} of its {layers} blocks; SLEB "
                             f"never removes the first {self.early} and last {self.latter} (pruner.early_barrier, "
                             f"latter_barrier), so at most {max(layers - self.early - self.latter, 0)}")

    def count(self, n_layers: int, sparsity: float) -> int:
        """Rounded up, as the release's latency.py (ceil(L x ratio)) and its defaults (7 of 32 blocks at 20%)."""
        return math.ceil(n_layers * sparsity - 1e-9)

    def score(self, loaded: LoadedModel, calib=None) -> dict:
        loaded.check_lm_head()
        n_layers = len(transformer_blocks(loaded.model)[1])
        n = min(self.count(n_layers, self.max_fraction), n_layers - self.early - self.latter)
        batches = calibration_batches(loaded, calib, 1)
        order, nll = greedy_order(loaded, batches, n, self.early, self.latter)
        tokens = sum(batch["input_ids"][:, 1:].numel() for batch in batches)
        return {"order": torch.tensor(order, dtype=torch.long), "nll": torch.tensor(nll, dtype=torch.float64),
                "tokens": tokens}

    def drop(self, scores, n_layers: int, n: int) -> set[int]:
        order = scores["order"].tolist()
        if n > len(order):
            raise ValueError(f"SLEB scored the first {len(order)} removals of {n_layers} blocks (pruner.max_fraction="
                             f"{self.max_fraction}, barriers {self.early}/{self.latter}); {n} asked")
        return set(order[:n])

    def prune(self, loaded: LoadedModel, scores, sparsity: float) -> dict[str, float]:
        n = self.count(len(transformer_blocks(loaded.model)[1]), sparsity)
        stats = super().prune(loaded, scores, sparsity)
        if n:
            stats["sleb/calib_ppl"] = math.exp(float(scores["nll"][n - 1]) / scores["tokens"])
        return stats
