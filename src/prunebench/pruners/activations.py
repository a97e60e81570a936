"""What pruners observe of calibration data flowing through a causal LM's decoder blocks.

Samples run one at a time (as the SparseGPT and Wanda code do), each a batch of model inputs
(token windows, or a vision-language model's image+text), through the body without the LM head
(structured.observe), whose vocabulary dwarfs the rest on small models."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from prunebench.models.introspection import transformer_blocks
from prunebench.models.offload import execution_device, onloaded
from prunebench.pruners.matrices import Matrix, input_hooks
from prunebench.pruners.structured import observe


@contextmanager
def square_sums(matrices: dict[str, Matrix]):
    """Yields, while it lasts, the sum over the tokens seen of x_j^2 per input feature j of each
    matrix (Wanda's ||X_j||^2), in float64 so long calibration sets do not lose the small features."""
    sums = {name: torch.zeros(lin.in_features, dtype=torch.float64) for name, lin in matrices.items()}

    def observe_input(name, x):
        sums[name] += x.double().pow(2).sum(0).cpu()

    with input_hooks(matrices, observe_input):
        yield sums


def matrix_device(matrix: Matrix) -> torch.device:
    """Where a matrix computes (its weight may be on `meta`, offloaded between forwards: models/offload.py)."""
    return execution_device(matrix.linear) if matrix.linear is not None else matrix.weight.device


# how ||X_j||^2 is accumulated over the calibration samples (pruner.norm_sum)
NORM_SUMS = ("release", "float64")


def check_norm_sum(norm_sum) -> str:
    if norm_sum not in NORM_SUMS:
        raise ValueError(f"pruner.norm_sum={norm_sum!r} is not one of {list(NORM_SUMS)} (release: the released "
                         "code's float32 running mean; float64: a float64 sum divided by the sample count)")
    return norm_sum


class SquareMeans:
    """Wanda's ||X_j||^2 of each matrix: the mean over samples of each sample's sum over tokens of
    x_j^2, accumulated as `norm_sum` says.

    `release`: the float32 running mean of the released code's WrappedGPT.add_batch (Wanda's, and
    OWL's and DSnoT's copies), step for step: per sample, the mean so far scaled by n / (n + 1), then
    torch.norm(x^T, p=2, dim=1) ** 2 / (n + 1) added, on the input transposed and cast to float32 as
    it casts it. Scores one float32 ulp apart at a row's cut are ranked by those last bits, and
    block-by-block pruning spreads a flipped pair to later blocks, so only this arithmetic gives the
    release's masks. `float64`: a float64 sum divided by the sample count at the end (more exact; the
    arithmetic of runs before the option existed). Each observed call counts as one sample: the
    batches hold one window each, and an expert's mean is over the samples that reached it."""

    def __init__(self, matrices: dict[str, Matrix], norm_sum: str):
        self.norm_sum = check_norm_sum(norm_sum)
        dtype = torch.float32 if norm_sum == "release" else torch.float64
        self.totals = {name: torch.zeros(m.in_features, dtype=dtype,
                                         device=matrix_device(m) if norm_sum == "release" else "cpu")
                       for name, m in matrices.items()}
        self.seen = dict.fromkeys(matrices, 0)

    def observe(self, name: str, x: torch.Tensor) -> None:
        if self.norm_sum == "float64":
            self.totals[name] += x.double().pow(2).sum(0).cpu()
            return
        total, before = self.totals[name], self.seen[name]
        total *= before / (before + 1)
        self.seen[name] = before + 1
        total += torch.norm(x.t().to(torch.float32), p=2, dim=1) ** 2 / self.seen[name]

    def means(self, samples: int) -> dict[str, torch.Tensor]:
        """`samples`: how many samples ran (float64 divides its sums by it; the running means are means already)."""
        if self.norm_sum == "release":
            return dict(self.totals)
        return {name: total / samples for name, total in self.totals.items()}


@torch.no_grad()
def input_square_means(model, matrices: dict[str, Matrix], samples: list[dict], norm_sum: str
                       ) -> dict[str, torch.Tensor]:
    """SquareMeans of every matrix in one forward of the dense model over the samples."""
    means = SquareMeans(matrices, norm_sum)
    with input_hooks(matrices, means.observe):
        for batch in samples:
            observe(model, {**batch, "use_cache": False})
    return means.means(len(samples))


@torch.no_grad()
def block_square_means(block, matrices: dict[str, Matrix], hiddens: list[torch.Tensor], calls: list[tuple],
                       norm_sum: str) -> dict[str, torch.Tensor]:
    """SquareMeans of one block's matrices while it runs on every sample's hidden state."""
    means = SquareMeans(matrices, norm_sum)
    with input_hooks(matrices, means.observe):
        replay(block, hiddens, calls)
    return means.means(len(hiddens))


@torch.no_grad()
def input_square_sums(model, matrices: dict[str, Matrix], samples: list[dict]) -> dict[str, torch.Tensor]:
    """square_sums of every matrix in one forward of the dense model over the samples."""
    with square_sums(matrices) as sums:
        for batch in samples:
            observe(model, {**batch, "use_cache": False})
    return sums


@torch.no_grad()
def block_calls(model, samples: list[dict]) -> tuple[list[torch.Tensor], list[list[tuple]]]:
    """Each sample's hidden state entering the first block, and the other arguments (masks,
    rotary embeddings, which differ between a model's layer types) the model passes to each block.

    Every block's forward is replaced by a recorder that returns its input unchanged, so this pass
    costs only the embeddings; replaying block i with (hidden, *args, **kwargs) then propagates any
    hidden state, such as one coming out of already pruned blocks."""
    _, blocks = transformer_blocks(model)
    firsts, calls = [], []

    def recorder(index):
        def forward(*args, **kwargs):
            hidden = args[0] if args else kwargs.pop("hidden_states")
            calls[-1].append((args[1:], kwargs))
            if index == 0:
                firsts.append(hidden)
            return hidden
        return forward

    with forwards_replaced(blocks, recorder):
        for batch in samples:
            calls.append([])
            observe(model, {**batch, "use_cache": False})
    return firsts, [list(per_block) for per_block in zip(*calls)]


@contextmanager
def forwards_replaced(blocks, forward: Callable):
    """Each block's forward is `forward(index)` inside, as it was after: the forward a block had of
    its own (accelerate's hook around it, on a placed or offloaded model) is put back, not deleted."""
    saved = [block.__dict__.get("forward") for block in blocks]
    for index, block in enumerate(blocks):
        block.forward = forward(index)
    try:
        yield
    finally:
        for block, own in zip(blocks, saved):
            if own is None:
                del block.forward
            else:
                block.forward = own


def run_block(block, hidden: torch.Tensor, call: tuple) -> torch.Tensor:
    args, kwargs = call
    out = block(hidden, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def replay(block, hiddens: list[torch.Tensor], calls: list[tuple]) -> list[torch.Tensor]:
    """The block's output for every sample, as it is now (pruned or not)."""
    return [run_block(block, hidden, call) for hidden, call in zip(hiddens, calls)]


@torch.no_grad()
def block_by_block(model, samples: list[dict], prune: Callable, through_pruned: bool = True) -> None:
    """The released loop of Wanda, SparseGPT, DSnoT and OWL's pruning pass: the samples enter the
    first block; each block is handed to prune(index, block, hiddens, calls), which observes it on
    `hiddens` (still dense itself) and prunes it, and is then run again, now pruned, to give the next
    block its inputs (the release recomputes them after pruning, so block i sees blocks 0..i-1
    pruned). through_pruned=False: the next block's inputs are the block's outputs before it was
    pruned, so every block is observed on the dense model's activations.

    A block accelerate offloads (models/offload.py) comes to its device for all of this and goes back
    pruned before the next comes: one block's weights at a time, whatever the model's size."""
    _, blocks = transformer_blocks(model)
    hiddens, calls = block_calls(model, samples)
    for index, (block, block_call) in enumerate(zip(blocks, calls)):
        with onloaded(block):
            dense_outputs = None if through_pruned else replay(block, hiddens, block_call)
            prune(index, block, hiddens, block_call)
            hiddens = replay(block, hiddens, block_call) if through_pruned else dense_outputs


@torch.no_grad()
def input_grams(block, matrices: dict[str, Matrix], hiddens: list[torch.Tensor], calls: list[tuple]
                ) -> dict[str, torch.Tensor]:
    """X^T X / tokens (float64) of each Linear's inputs while the block runs on every sample:
    SparseGPT's layer Hessian up to a constant factor, which its update does not depend on."""
    grams = {name: torch.zeros(lin.in_features, lin.in_features, dtype=torch.float64, device=lin.weight.device)
             for name, lin in matrices.items()}
    tokens = dict.fromkeys(matrices, 0)

    def observe_input(name, x):
        x = x.float()
        grams[name] += (x.T @ x).double()
        tokens[name] += x.shape[0]

    with input_hooks(matrices, observe_input):
        replay(block, hiddens, calls)
    return {name: gram / max(tokens[name], 1) for name, gram in grams.items()}
