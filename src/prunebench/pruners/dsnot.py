"""DSnoT, Dynamic Sparse No Training (Zhang et al., ICLR 2024; code zyxxmu/DSnoT): a base pruner's
mask repaired without touching a weight, by swapping pruned and kept weights of each output row.

A row's reconstruction error is what its pruned weights took out of the output on average,
sum_j W_ij * xbar_j over its pruned inputs (xbar_j: the input's token sum, averaged over samples).
Each cycle, every row still updating regrows the pruned weight that cuts that error most (its
W_ij * xbar_j of the error's sign, largest after division by the input's variance to the power
`pow_of_var_regrowing`) and prunes a kept weight whose W_ij * xbar_j has the opposite sign (the
lowest Wanda score among them; N:M: the lowest base score in the regrown weight's group of M). A
row stops for good once |error| <= `update_threshold`, after `max_cycles`, or (N:M, and `same_sign`)
when the swap would flip the error's sign. Each row keeps its count of pruned weights.

The inputs are measured block by block through the blocks already pruned, as the released code
does (`sequential`, default; false: every block on the dense model's activations, an ablation), so
all the work happens in `apply`. Departures are listed in docs/unstructured.md (DSnoT)."""

from __future__ import annotations

import time

import torch

from prunebench.models.introspection import transformer_blocks
from prunebench.models.loaded import LoadedModel
from prunebench.pruners.activations import SquareMeans, block_by_block, check_norm_sum, input_grams, replay
from prunebench.pruners.masks import lowest_per_row, n_of_m
from prunebench.pruners.matrices import Matrix, input_hooks
from prunebench.pruners.structured import calibration_batches
from prunebench.pruners.unstructured import (MODULES, MagnitudePruner, SparseGPTPruner, UnstructuredPruner,
                                             WandaPruner, Zeros, module_kind)

BASES = {"wanda": WandaPruner, "sparsegpt": SparseGPTPruner, "magnitude": MagnitudePruner}


@torch.no_grad()
def input_moments(block, matrices: dict[str, Matrix], hiddens: list[torch.Tensor], calls: list[tuple],
                  norm_sum: str = "float64") -> dict[str, dict[str, torch.Tensor]]:
    """Per input feature of each matrix while `block` runs every sample (float64): `sum`, the token
    sum averaged over samples (the release's `sum_metric_row`); `var`, each sample's own variance
    averaged over tokens (its running `var`, which leaves out how the samples' means differ);
    `squares`, the sum of x^2 over a sample's tokens averaged over samples (Wanda's ||X_j||^2, the
    release's `scaler_row`, accumulated as `norm_sum` says: activations.SquareMeans; `release` is
    its float32 running mean)."""
    acc = {name: {key: torch.zeros(m.in_features, dtype=torch.float64, device=m.weight.device)
                  for key in ("sum", "var", "squares")} for name, m in matrices.items()}
    counts = {name: [0, 0] for name in matrices}  # samples, tokens
    running = SquareMeans(matrices, norm_sum) if check_norm_sum(norm_sum) == "release" else None

    def observe_input(name, x):
        if running:
            running.observe(name, x)
        x = x.double()
        acc[name]["sum"] += x.sum(0)
        if not running:
            acc[name]["squares"] += x.pow(2).sum(0)
        acc[name]["var"] += x.var(0, correction=0) * len(x)
        counts[name][0] += 1
        counts[name][1] += len(x)

    with input_hooks(matrices, observe_input):
        replay(block, hiddens, calls)
    for name, (samples, tokens) in counts.items():
        acc[name]["sum"] /= max(samples, 1)
        acc[name]["squares"] /= max(samples, 1)
        acc[name]["var"] /= max(tokens, 1)
        if running:
            acc[name]["squares"] = running.totals[name]
    return acc


class Queue:
    """The columns a row may take, in the order it takes them, and how far each row has got."""

    def __init__(self, key: torch.Tensor, members: torch.Tensor, descending: bool = False):
        # stable: equal keys go by column; descending is that order reversed, as a pointer walking
        # the release's ascending sort from its end takes them
        outside = -torch.inf if descending else torch.inf
        order = torch.sort(key.masked_fill(~members, outside), dim=1, stable=True).indices
        self.order = order.flip(1) if descending else order
        self.count = members.sum(1)
        self.taken = torch.zeros_like(self.count)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next column, and whether it has one left."""
        at = self.taken.clamp(max=self.order.shape[1] - 1)
        return self.order.gather(1, at[:, None])[:, 0], self.taken < self.count


def either(take_first: torch.Tensor, first: Queue, second: Queue) -> tuple[torch.Tensor, torch.Tensor]:
    """From each row's chosen queue its next column and whether it had one; that queue moves on."""
    (col1, ok1), (col2, ok2) = first.next(), second.next()
    first.taken += take_first
    second.taken += ~take_first
    return torch.where(take_first, col1, col2), torch.where(take_first, ok1, ok2)


class Repair:
    """One matrix's mask (True = pruned) under repair, with each row's error and state."""

    def __init__(self, mask: torch.Tensor, contribution: torch.Tensor, grow_score: torch.Tensor):
        self.mask, self.contribution = mask, contribution
        self.rows = torch.arange(mask.shape[0], device=mask.device)
        self.error = contribution.masked_fill(~mask, 0).sum(1)
        self.initial_sign = self.error.sign()
        self.active = torch.ones_like(self.error, dtype=torch.bool)
        # regrowing a weight whose contribution is zero, NaN or of the error's own sign cannot
        # shrink the error: those are left out (the release's pointers would reach kept weights there)
        self.grow_up = Queue(grow_score, mask & (grow_score > 0), descending=True)
        self.grow_down = Queue(grow_score, mask & (grow_score < 0))
        self.swaps = 0

    def regrow(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A positive error takes back the pruned weight with the largest score, else the lowest."""
        return either(self.error > 0, self.grow_up, self.grow_down)

    def swap(self, grow: torch.Tensor, prune: torch.Tensor, ok: torch.Tensor, threshold: float, same_sign: bool):
        gained, lost = (self.contribution.gather(1, cols[:, None])[:, 0] for cols in (prune, grow))
        after = self.error + gained - lost  # this order of additions, as the release's
        self.active &= ok & (self.error.abs() > threshold)
        if same_sign:
            self.active &= after.sign() == self.initial_sign
        rows = self.rows[self.active]
        self.mask[rows, grow[self.active]] = False
        self.mask[rows, prune[self.active]] = True
        self.error = torch.where(self.active, after, self.error)
        self.swaps += len(rows)


def repair_rows(repair: Repair, prune_score: torch.Tensor, cycles: int, threshold: float, same_sign: bool):
    """Unstructured: the kept weight pruned has the lowest `prune_score` (Wanda's) among those whose
    contribution pushes the error back towards zero."""
    kept = ~repair.mask
    prune_up = Queue(prune_score, kept & (repair.contribution > 0))
    prune_down = Queue(prune_score, kept & (repair.contribution < 0))
    for _ in range(cycles):
        if not repair.active.any():
            break
        grow, grow_ok = repair.regrow()
        prune, prune_ok = either(repair.error < 0, prune_up, prune_down)
        repair.swap(grow, prune, grow_ok & prune_ok, threshold, same_sign)


def repair_groups(repair: Repair, base_score: torch.Tensor, m: int, cycles: int, threshold: float):
    """N:M: the kept weight pruned is the lowest-`base_score` one of the regrown weight's group of M
    not chosen before (first column on ties), whatever its sign; the error's sign must hold."""
    candidates = base_score.double().masked_fill(repair.mask, torch.inf)
    offsets = torch.arange(m, device=candidates.device)
    for _ in range(cycles):
        if not repair.active.any():
            break
        grow, grow_ok = repair.regrow()
        start = grow - grow % m
        group = candidates.gather(1, start[:, None] + offsets)
        lowest, at = group.min(1)
        prune = start + at
        repair.swap(grow, prune, grow_ok & (lowest < torch.inf), threshold, same_sign=True)
        candidates[repair.rows[repair.active], prune[repair.active]] = torch.inf


class DSnoTPruner(UnstructuredPruner):
    """DSnoT on top of `base` (wanda, sparsegpt or magnitude), whose score ranks each row's initial
    mask (exact count per row, or N:M), as the released code ranks every base. Options as in
    conf/pruner/dsnot.yaml; `repair_modules` are the module kinds repaired (the release skips MLP);
    `norm_sum` is how ||X_j||^2 is accumulated, for the wanda base's mask and the repair's ranking."""

    families = frozenset({"causal_lm"})
    needs_calibration = True
    cacheable = False

    def block_work_bytes(self, shapes: list[tuple[int, int]], size: int) -> int:
        """The base's statistics (a sparsegpt base's Hessians) and three float64 moments per input."""
        return self.base.block_work_bytes(shapes, size) + sum(3 * cols * 8 for _, cols in shapes)

    def __init__(self, name: str = "dsnot", base: str = "wanda", max_cycles: int = 50, update_threshold: float = 0.1,
                 pow_of_var_regrowing: float = 1.0, same_sign: bool = False,
                 repair_modules: list[str] = ("attention",), damp: float = 0.01, sequential: bool = True,
                 norm_sum: str = "release", **options):
        super().__init__(name, scope="row", **options)
        self.norm_sum = check_norm_sum(norm_sum)
        if not isinstance(sequential, bool):
            raise ValueError(f"pruner.sequential={sequential!r} must be true (the release: each block measured through "
                             "the pruned blocks) or false (every block on the dense model's activations)")
        if base not in BASES:
            raise ValueError(f"pruner.base={base!r} is not one of {list(BASES)}")
        if max_cycles < 0:
            raise ValueError(f"pruner.max_cycles={max_cycles} must be >= 0 (0: the base's mask, unrepaired)")
        bad = [m for m in repair_modules if m not in MODULES]
        if bad:
            raise ValueError(f"pruner.repair_modules={list(repair_modules)} must be a subset of {list(MODULES)}")
        extra = {"damp": damp} if base == "sparsegpt" else {"norm_sum": norm_sum} if base == "wanda" else {}
        self.base = BASES[base](**options, **extra)
        self.max_cycles, self.update_threshold = max_cycles, update_threshold
        self.pow_of_var_regrowing, self.same_sign = pow_of_var_regrowing, same_sign
        self.repair_modules, self.sequential = set(repair_modules), sequential

    def score(self, loaded: LoadedModel, calib=None) -> list[dict[str, torch.Tensor]]:
        return calibration_batches(loaded, calib, 1)

    @torch.no_grad()
    def apply(self, loaded: LoadedModel, samples: list[dict], sparsity: float) -> dict[str, float]:
        prefix, _ = transformer_blocks(loaded.model)
        totals = {"initial_s": 0.0, "cycles_s": 0.0, "regrown": 0, "pruned": 0}
        zeros = Zeros()

        def prune_block(index, block, hiddens, calls):
            targets = self.block_targets(prefix, index, block)
            if targets:
                moments = input_moments(block, targets, hiddens, calls, self.norm_sum)
                grams = (input_grams(block, targets, hiddens, calls)
                         if isinstance(self.base, SparseGPTPruner) else None)
                for name, matrix in targets.items():
                    self.prune_matrix(name, matrix, moments[name], grams, sparsity, totals)
                zeros.add(targets)

        block_by_block(loaded.model, samples, prune_block, through_pruned=self.sequential)
        stats = zeros.stats()
        return {**stats, "dsnot/initial_s": totals["initial_s"], "dsnot/cycles_s": totals["cycles_s"],
                "dsnot/regrown": totals["regrown"] / max(totals["pruned"], 1)}

    @torch.no_grad()
    def prune_matrix(self, name: str, matrix: Matrix, moments: dict[str, torch.Tensor], grams, sparsity: float,
                     totals: dict) -> None:
        """The base's mask, repaired when `name` is of a repaired kind; `totals` gathers the time spent
        on each and the share of pruned weights regrown."""
        start = time.perf_counter()
        base_score = self.base.importance({name: matrix}, grams or {name: moments["squares"]})[name]
        mask = n_of_m(base_score, *self.pattern) if self.pattern else lowest_per_row(base_score, sparsity)
        middle = time.perf_counter()
        if self.max_cycles and module_kind(name) in self.repair_modules:
            w = matrix.weight.double()
            contribution = w * moments["sum"][None, :]
            repair = Repair(mask, contribution, contribution / moments["var"][None, :] ** self.pow_of_var_regrowing)
            if self.pattern:
                repair_groups(repair, base_score, self.pattern[1], self.max_cycles, self.update_threshold)
            else:
                wanda = w.abs() * moments["squares"].sqrt()[None, :]
                repair_rows(repair, wanda, self.max_cycles, self.update_threshold, self.same_sign)
            totals["regrown"] += repair.swaps
        matrix.weight.masked_fill_(mask, 0)
        totals["initial_s"] += middle - start
        totals["cycles_s"] += time.perf_counter() - middle
        totals["pruned"] += int(mask.sum())
