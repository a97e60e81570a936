"""DSnoT against a reference written here from the released code (zyxxmu/DSnoT, lib/prune.py
`prune_DSnoT`, lib/layerwrapper.py `WrappedGPT`), step by step and vectorised as it is: the same
running statistics, sorts, pointer pairs and scatters. Statistics are float64 on both sides, so the
comparison is of the algorithm rather than of the release's float32 rounding; the initial ranking is
float32 on both, as the release's metrics are.

The release's pointers walk past the end of a row's candidates when a row has fewer of one sign
than there are cycles (it then prunes kept weights through the regrowing scatter); ours stops that
row instead. The conformance cases are sized so that no pointer gets there (the reference checks
it), and one test shows the difference on a row that does."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_cfg
from prunebench.models.tiny import load_tiny
from prunebench.pruners.activations import input_grams
from prunebench.pruners.dsnot import DSnoTPruner, input_moments
from prunebench.pruners.matrices import block_matrices

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "self_attn.q_proj"


# ---- the reference, from lib/layerwrapper.py and lib/prune.py ----------------------------------

def wrapped_gpt_stats(xs: list[torch.Tensor]):
    """WrappedGPT.add_batch over one [tokens, in] input per sample: running scaler_row, sum_metric_row, var."""
    cols = xs[0].shape[1]
    scaler, summ, var = torch.zeros(cols, dtype=torch.float64), torch.zeros(cols, dtype=torch.float64), None
    nsamples = ntokens = 0
    for x in xs:
        inp = x.double().t()
        var_inp, num = inp.var(1, unbiased=False), inp.shape[1]
        var = var_inp if ntokens == 0 else (var * ntokens + var_inp * num) / (ntokens + num)
        ntokens += num
        scaler *= nsamples / (nsamples + 1)
        summ *= nsamples / (nsamples + 1)
        nsamples += 1
        scaler += torch.norm(inp, p=2, dim=1) ** 2 / nsamples
        summ += torch.sum(inp, dim=1) / nsamples
    return scaler, summ, var


def initial_metric(base: str, w: torch.Tensor, scaler: torch.Tensor, xs: list[torch.Tensor]) -> torch.Tensor:
    """prune_DSnoT's initial_metric per initial_method, float32 as the release computes it; for
    sparsegpt, the calibration Hessian (the release's WrappedGPT never accumulates its H)."""
    if base == "wanda":
        return (w.abs().double() * torch.sqrt(scaler.reshape((1, -1)))).float()
    if base == "magnitude":
        return w.abs().float()
    x = torch.cat(xs).double()
    h, w = x.T @ x, w.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h[torch.arange(len(h)), torch.arange(len(h))] += 0.01 * torch.mean(torch.diag(h))
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    return (w ** 2 / torch.diag(hinv).reshape((1, -1)) ** 2).float()


def return_reorder_indice(t: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(t.shape[1], dtype=torch.float64).repeat(t.shape[0], 1)
    neg = pos.clone()
    pos[~(t > 0)] = float("inf")
    neg[~(t < 0)] = float("inf")
    pos = torch.flip(torch.sort(pos, dim=1)[0], dims=[1])
    neg = torch.sort(neg, dim=1)[0]
    neg[neg == float("inf")] = 0
    pos[pos == float("inf")] = 0
    return (pos + neg).to(torch.int64)


def pointers(rows: int, last: int):
    """indice_indice_list (front and back positions) and update_num (+1, -1)."""
    at = torch.zeros((rows, 2), dtype=torch.long)
    at[:, 1] = last
    step = torch.ones((rows, 2), dtype=torch.long)
    step[:, 1] = -1
    return at, step


def take(order, at, step, side):
    """gather the side's position, the index there, and move that side's position on."""
    pos = torch.gather(at, 1, side)
    index = torch.gather(order, 1, pos)
    at.scatter_(1, side, pos + step.gather(1, side))
    return index


def regrowing_order(dsnot, res_indices, var, pow_var):
    metric = dsnot.clone()
    metric.scatter_(1, res_indices, 0)
    error = torch.sum(metric, dim=1, keepdim=True)
    if pow_var:
        metric /= torch.pow(var.reshape((1, -1)), pow_var)
    return error, torch.sort(metric, dim=1, stable=True)[1]


def release_unstructured(init, dsnot, wanda, var, sparsity, cycles, threshold, pow_var, without_same_sign=True):
    rows, cols = init.shape
    mask = torch.zeros_like(init, dtype=torch.bool)
    k = int(cols * sparsity)
    prune_idx, res_idx = torch.split(torch.sort(init, dim=-1, stable=True)[1], [k, cols - k], dim=1)
    mask.scatter_(1, prune_idx, True)
    error, regrow_order = regrowing_order(dsnot, res_idx, var, pow_var)
    sign0 = torch.sign(error)
    wanda = wanda.clone()
    wanda.scatter_(1, prune_idx, float("inf"))
    wanda_res = torch.split(torch.sort(wanda, dim=1, stable=True)[1], [cols - k, k], dim=1)[0]
    prune_order = torch.gather(wanda_res, 1, return_reorder_indice(torch.gather(dsnot, 1, wanda_res)))
    g_at, g_step = pointers(rows, cols - 1)
    p_at, p_step = pointers(rows, cols - k - 1)
    update = torch.ones_like(error, dtype=torch.bool)
    cycle = 0
    while not (torch.all(~update) or cycle >= cycles):
        cycle += 1
        grow = take(regrow_order, g_at, g_step, (error > 0).long())
        grow_m = dsnot.gather(1, grow)
        prune = take(prune_order, p_at, p_step, (error < 0).long())
        prune_m = dsnot.gather(1, prune)
        after = error + prune_m - grow_m
        update = update & (abs(error) > threshold)
        if not without_same_sign:
            update = update & (sign0 == torch.sign(after))
        mask.scatter_(1, prune, update)
        mask.scatter_(1, grow, ~update)
        error += torch.where(update, prune_m, torch.zeros_like(prune_m))
        error -= torch.where(update, grow_m, torch.zeros_like(grow_m))
    return mask


def release_n_m(init, dsnot, var, prune_n, prune_m, cycles, threshold, pow_var):
    rows, cols = init.shape
    mask = torch.zeros_like(init, dtype=torch.bool)
    prune_idx, res_idx = [], []
    for ii in range(0, cols, prune_m):
        order = torch.sort(init[:, ii:ii + prune_m].float(), dim=1)[1] + ii
        pruned, kept = torch.split(order, [prune_n, prune_m - prune_n], dim=1)
        prune_idx.append(pruned)
        res_idx.append(kept)
        mask.scatter_(1, pruned, True)
    prune_idx, res_idx = torch.cat(prune_idx, 1), torch.cat(res_idx, 1)
    error, regrow_order = regrowing_order(dsnot, res_idx, var, pow_var)
    sign0 = torch.sign(error)
    g_at, g_step = pointers(rows, cols - 1)
    init = init.clone()
    init.scatter_(1, prune_idx, float("inf"))
    max_value = torch.max(init, dim=1, keepdim=True)[0] + 1
    cycle, update = 1, torch.ones_like(error, dtype=torch.bool)
    while not (torch.all(~update) or cycle > cycles):
        cycle += 1
        side = (error > 0).long()
        pos = torch.gather(g_at, 1, side)
        grow = torch.gather(regrow_order, 1, pos)
        grow_m = dsnot.gather(1, grow)
        start = grow - grow % prune_m
        group = torch.arange(prune_m).repeat(start.shape[1], 1) + start
        prune = torch.topk(torch.gather(init, 1, group), 1, dim=1, largest=False)[1] + start
        prune_metric = dsnot.gather(1, prune)
        after = error + prune_metric - grow_m
        update = update & (sign0 == torch.sign(after)) & (abs(error) > threshold)
        init.scatter_(1, prune, max_value)
        mask.scatter_(1, prune, update)
        mask.scatter_(1, grow, ~update)
        error += torch.where(update, prune_metric, torch.zeros_like(prune_metric))
        error -= torch.where(update, grow_m, torch.zeros_like(grow_m))
        g_at.scatter_(1, side, pos + g_step.gather(1, side))
    return mask


def release_mask(name, w, xs, base, sparsity, pattern, cycles=50, threshold=0.1, pow_var=1.0, skip="mlp"):
    """prune_DSnoT's mask for one Linear `name` of a layer, given its inputs (one tensor per sample)."""
    scaler, summ, var = wrapped_gpt_stats(xs)
    init = initial_metric(base, w, scaler, xs)
    dsnot = w.double() * summ.reshape((1, -1))
    skipped = name.split(".")[0] == skip
    if pattern:
        n, m = pattern
        if skipped:
            cycles = 0
        mask = release_n_m(init, dsnot, var, m - n, m, cycles, threshold, pow_var)
    else:
        wanda = w.abs().double() * torch.sqrt(scaler.reshape((1, -1)))
        mask = release_unstructured(init, dsnot, wanda, var, sparsity, 0 if skipped else cycles, threshold, pow_var)
    kept = (~mask).sum(1)
    # the conformance precondition: no pointer walked past its candidates (else the count drifts)
    assert torch.all(kept == kept[0]), "the release's pointers left their candidates: resize the case"
    return mask


# ---- ours ----------------------------------------------------------------------------------------

class Layer(torch.nn.Module):
    """One attention projection in a block, its inputs what the test gives."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.q_proj = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.self_attn.q_proj.weight.data.copy_(weight)

    def forward(self, x):
        return self.self_attn.q_proj(x)


def ours_mask(w, xs, base, sparsity, pattern=None, **options):
    layer = Layer(w)
    targets = block_matrices(layer)
    calls = [((), {})] * len(xs)
    pruner = DSnoTPruner(base=base, pattern=pattern, **options)
    grams = input_grams(layer, targets, xs, calls) if base == "sparsegpt" else None
    totals = {"initial_s": 0.0, "cycles_s": 0.0, "regrown": 0, "pruned": 0}
    pruner.prune_matrix(NAME, targets[NAME], input_moments(layer, targets, xs, calls)[NAME], grams, sparsity, totals)
    return layer.self_attn.q_proj.weight == 0, totals


def activations(cols, samples=4, tokens=64, seed=0):
    """Inputs with per-feature means and spreads, so expectation and variance both matter."""
    gen = torch.Generator().manual_seed(seed)
    mean, spread = torch.randn(cols, generator=gen), torch.rand(cols, generator=gen) + 0.2
    return [torch.randn(tokens, cols, generator=gen) * spread + mean for _ in range(samples)]


def weights(rows, cols, seed=1):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05


def initial_only(w, xs, base, sparsity, pattern=None):
    return ours_mask(w, xs, base, sparsity, pattern, max_cycles=0)[0]


@pytest.mark.parametrize("base", ["wanda", "magnitude", "sparsegpt"])
@pytest.mark.parametrize("pattern", [None, (2, 4)])
def test_one_layer_equals_the_release_at_its_defaults_and_regrows(base, pattern):
    w, xs = weights(48, 256), activations(256)
    sparsity = 0.5 if pattern else 0.6
    ours, totals = ours_mask(w, xs, base, sparsity, f"{pattern[0]}:{pattern[1]}" if pattern else None)
    reference = release_mask(NAME, w, xs, base, sparsity, pattern)
    assert int((ours != reference).sum()) == 0
    moved = int((ours != initial_only(w, xs, base, sparsity, "2:4" if pattern else None)).sum())
    assert moved > 0.02 * w.numel()  # regrowing changed the mask: without it the comparison fails
    assert totals["regrown"] == moved // 2  # each swap moves one weight each way
    # each row keeps its count exactly (each group of 4 its 2 under 2:4)
    counts = ours.view(48, -1, 4).sum(2) if pattern else ours.sum(1)
    assert torch.all(counts == (2 if pattern else int(256 * sparsity)))


@pytest.mark.parametrize("options", [{"same_sign": True}, {"pow_of_var_regrowing": 0.0},
                                     {"update_threshold": 0.0, "max_cycles": 20}])
def test_the_release_switches(options):
    """without_same_sign=False, pow_of_var_regrowing=0, another threshold and cycle count."""
    w, xs = weights(32, 256, seed=2), activations(256, seed=3)
    ours, _ = ours_mask(w, xs, "wanda", 0.7, **options)
    reference = release_mask(NAME, w, xs, "wanda", 0.7, None, cycles=options.get("max_cycles", 50),
                             threshold=options.get("update_threshold", 0.1),
                             pow_var=options.get("pow_of_var_regrowing", 1.0))
    if options.get("same_sign"):
        scaler, summ, var = wrapped_gpt_stats(xs)
        init, dsnot = initial_metric("wanda", w, scaler, xs), w.double() * summ[None]
        wanda = w.abs().double() * scaler.sqrt()[None]
        reference = release_unstructured(init, dsnot, wanda, var, 0.7, 50, 0.1, 1.0, without_same_sign=False)
    assert int((ours != reference).sum()) == 0
    assert int((ours != initial_only(w, xs, "wanda", 0.7)).sum()) > 0


def test_a_row_out_of_candidates_stops_where_the_release_loses_its_count():
    """16 inputs at 50%: 8 pruned a row, 50 cycles with no threshold: the release's pointers run past
    a row's candidates (regrowing kept weights, or indexing past the row's end); ours stops the row."""
    w, xs = weights(24, 16, seed=4), activations(16, seed=5)
    ours, _ = ours_mask(w, xs, "wanda", 0.5, update_threshold=0.0)
    assert torch.all(ours.sum(1) == 8)
    assert int((ours != initial_only(w, xs, "wanda", 0.5)).sum()) > 0
    with pytest.raises((AssertionError, RuntimeError), match="left their candidates|out of bounds"):
        release_mask(NAME, w, xs, "wanda", 0.5, None, threshold=0.0)


# ---- through a model: inputs measured through the blocks already pruned ------------------------

CONFIG = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def release_model(model, samples, base, sparsity, pattern, cycles, skip):
    """prune_DSnoT's layer loop: each layer's Linear inputs gathered with the layer still dense, on the
    outputs of the layers before it, already pruned; then every Linear of the layer pruned."""
    for layer in model.model.layers:
        linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        seen = {n: [] for n in linears}
        hooks = [m.register_forward_hook(lambda mod, args, out, n=n: seen[n].append(args[0].flatten(0, -2)))
                 for n, m in linears.items()]
        with torch.no_grad():
            for sample in samples:
                model(**sample)
        for h in hooks:
            h.remove()
        masks = {n: release_mask(n, m.weight.detach(), seen[n], base, sparsity, pattern, cycles=cycles, skip=skip)
                 for n, m in linears.items()}
        for n, m in linears.items():
            m.weight.data[masks[n]] = 0


@pytest.mark.parametrize("base, pattern", [("wanda", None), ("sparsegpt", None), ("magnitude", (2, 4)),
                                           ("wanda", (2, 4))])
def test_tiny_llama_equals_the_release_layer_by_layer(base, pattern):
    gen = torch.Generator().manual_seed(0)
    ours = load_tiny(name="t", config=CONFIG, seed=3)
    reference = load_tiny(name="t", config=CONFIG, seed=3)
    samples = [{"input_ids": torch.randint(ours.model.config.vocab_size, (1, 32), generator=gen)} for _ in range(4)]
    sparsity = 0.5 if pattern else 0.6
    # 8 cycles: the rows of 128 inputs keep candidates of each sign; both kinds repaired
    options = {"base": base, "max_cycles": 8, "repair_modules": ["attention", "mlp"]}
    spelled = f"{pattern[0]}:{pattern[1]}" if pattern else None
    stats = DSnoTPruner(pattern=spelled, **options).apply(ours, samples, sparsity)
    release_model(reference.model, samples, base, sparsity, pattern, 8, skip="none")
    unrepaired = load_tiny(name="t", config=CONFIG, seed=3)
    DSnoTPruner(pattern=spelled, **{**options, "max_cycles": 0}).apply(unrepaired, samples, sparsity)
    mismatches = moved = 0
    for name, w in reference.model.state_dict().items():
        if name.endswith("proj.weight"):
            mismatches += int(((ours.model.state_dict()[name] == 0) != (w == 0)).sum())
            moved += int(((unrepaired.model.state_dict()[name] == 0) != (w == 0)).sum())
    assert mismatches == 0
    assert moved > 0  # the release's repair moved weights, so a loop that regrows none fails above
    assert stats["dsnot/regrown"] > 0.01 and stats["sparsity/actual"] == pytest.approx(sparsity, abs=0.01)


def test_release_default_repairs_attention_only_and_validation_refuses_bad_options():
    gen = torch.Generator().manual_seed(0)
    loaded = load_tiny(name="t", config=CONFIG, seed=3)
    samples = [{"input_ids": torch.randint(loaded.model.config.vocab_size, (1, 32), generator=gen)} for _ in range(2)]
    wanda = load_tiny(name="t", config=CONFIG, seed=3)
    DSnoTPruner(max_cycles=0).apply(wanda, samples, 0.6)
    DSnoTPruner().apply(loaded, samples, 0.6)
    for (name, w), before in zip(loaded.model.named_parameters(), wanda.model.parameters()):
        if "layers.0.mlp" in name:  # later blocks' inputs differ once block 0's attention is repaired
            assert torch.equal(w == 0, before == 0), name
        elif name.endswith("q_proj.weight"):
            assert not torch.equal(w == 0, before == 0), name
    for bad, match in [({"base": "owl"}, "pruner.base"), ({"max_cycles": -1}, "max_cycles"),
                       ({"repair_modules": ["ffn"]}, "repair_modules")]:
        with pytest.raises(ValueError, match=match):
            DSnoTPruner(**bad)
    cfg = compose_cfg(["pruner=dsnot", "pruner.base=sparsegpt", "pruner.pattern='2:4'"])
    assert (cfg.pruner.base, cfg.pruner.max_cycles, cfg.pruner.update_threshold) == ("sparsegpt", 50, 0.1)
