"""Continuation log-likelihoods for a causal LM: many documents per forward, each document's shared
context computed once, and only continuation positions through the LM head.

All choices of a document share their leading tokens (the context). Documents are grouped by the
length of that shared prefix; each group's prefixes run as one left-padded batch that fills a KV
cache, then the choices' remaining tokens run against their documents' rows of that cache, grouped
by length too, so padding stays a small fraction of the work. The padding is masked and the position
ids are each sequence's own, so every real token sees exactly the keys, rotary positions and sliding
windows of its unpadded sequence: the result equals the plain one-sequence-per-choice computation
(tests hold it to 1e-4 in fp32).

Where every sequence fits inside the sliding window (or there is none) and the attention takes a
mask as given, documents without a shared stem run instead as tries (`_run_trees`): each distinct
token once, several documents' tries side by side in a row, under a mask of ancestors; no padding
between documents, no cache, one forward per row batch (on gemma3-270m, 40 documents each of
ARC-Challenge, HellaSwag and WinoGrande, fp32 and bf16: 1.03-1.54x less CPU time than the cached
path; docs/commonsense.md sets it against the limit of an exact scorer).

Documents may also share a stem with each other: a task's few-shot examples (MMLU 5-shot: the same
five exemplars before every question of a subject) or its description. Documents that share at least
`STEM_MIN` leading tokens (neighbours once sorted by their tokens) run that stem once, as one row
whose cache every document's own prefix then extends; lm-eval computes it again for each document.

Only the positions that predict continuation tokens go through the LM head and log-softmax, each
position once even when several choices score from it (at least the context's last token), and
without the full logits ever held (head.token_logprobs): with Gemma's 262k vocabulary the full
[batch, length, vocab] tensor that lm-eval builds is most of its cost.

Routing telemetry (MoE) counts the real tokens of every forward (`LoadedModel.counted`; padding
never): a shared context once per document as it is computed, or with `context_per_option` once per
option, as OpenCompass's PPL protocol runs every option's whole text as its own sequence."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from prunebench.evaluation.batching import left_pad, right_pad
from prunebench.evaluation.head import token_logprobs
from prunebench.models.loaded import LoadedModel


class Requests(Protocol):
    """One document's loglikelihood requests: `inputs[i]` is the fed sequence of choice i, whose last
    `cont_lens[i]` positions predict `conts[i]`."""

    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]


def common_prefix_len(seqs: list[list[int]]) -> int:
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n


# what one more forward costs, in padded positions: reading every weight once, whatever the batch,
# against one position's matmuls (about the same ratio for a 270M and a 7B model)
FORWARD_COST = 64
# a stem shorter than this is not split off: its saving would not pay for the extra forward
STEM_MIN = 32
# the row widths documents' tries are packed into (the longest trie's, if longer), and the positions
# of one forward of them
TREE_WIDTHS = (32, 64, 128, 256, 512)
TREE_ROW_TOKENS = 8192


def stems(docs: Sequence[Requests], shared: list[int]) -> list[tuple[list[int], int]]:
    """Documents grouped by a stem they share: (document indices, stem length), and one group of
    stem 0 holding every document that shares none worth a forward. Documents sorted by their tokens put sharers side
    by side; a group grows while its stem stays at least STEM_MIN long. A stem ends before every
    scored position and before each document's own prefix ends, so each document still runs a
    prefix of its own (the rows its choices' cache is selected from)."""
    limit = [min(shared[d] - 1, *(len(seq) - clen for seq, clen in zip(doc.inputs, doc.cont_lens)))
             for d, doc in enumerate(docs)]
    order = sorted(range(len(docs)), key=lambda d: docs[d].inputs[0])
    groups: list[tuple[list[int], int]] = []
    for d in order:
        if groups and groups[-1][1]:
            members, stem = groups[-1]
            common = min(stem, limit[d], common_prefix_len([docs[members[0]].inputs[0], docs[d].inputs[0]]))
            if common >= STEM_MIN:
                groups[-1] = (members + [d], common)
                continue
        groups.append(([d], limit[d] if limit[d] >= STEM_MIN else 0))
    # a stem of one document saves nothing: every document without a shared stem runs in one group,
    # batched together as if there were no stems
    shared_stems = [(members, stem) for members, stem in groups if stem and len(members) > 1]
    alone = [d for members, stem in groups if not (stem and len(members) > 1) for d in members]
    return shared_stems + ([(alone, 0)] if alone else [])


def padded_runs(items: list, length: Callable[[object], int], forward_cost: int = FORWARD_COST) -> list[list]:
    """`items` sorted longest first, cut into consecutive runs, each padded to its first item's
    length, so that the padded positions plus `forward_cost` per run are fewest: one forward per
    run, and padding that costs more than a forward never paid. An exact search over the cut points
    between distinct lengths (few: these are token counts), O(lengths^2). An empty item never joins
    non-empty ones, so no row is all padding."""
    lengths = [length(item) for item in items]
    bounds = [k for k in range(len(items)) if k == 0 or lengths[k] != lengths[k - 1]] + [len(items)]
    cost, cut = [0] + [None] * (len(bounds) - 1), [0] * len(bounds)
    for end in range(1, len(bounds)):
        for begin in range(end):
            width = lengths[bounds[begin]]
            if width and not lengths[bounds[end] - 1]:
                continue
            total = cost[begin] + (bounds[end] - bounds[begin]) * width + forward_cost
            if cost[end] is None or total < cost[end]:
                cost[end], cut[end] = total, begin
    runs, end = [], len(bounds) - 1
    while end:
        runs.append(items[bounds[cut[end]]:bounds[end]])
        end = cut[end]
    return runs[::-1]


class _ScoredPositions:
    """Hidden states of the positions whose next token is scored, each kept once under its keys:
    (doc, position) inside a document's shared prefix, (doc, choice, position) after it."""

    def __init__(self):
        self.rows: dict[tuple, int] = {}
        self.parts: list[torch.Tensor] = []
        self.count = 0

    def add(self, hidden: torch.Tensor, picks: list[tuple[tuple | list[tuple], int, int]]) -> None:
        """`picks`: (key or keys, batch row, sequence index) into hidden [batch, length, H]."""
        if not picks:
            return
        rows = torch.tensor([r for _, r, _ in picks], device=hidden.device)
        cols = torch.tensor([c for _, _, c in picks], device=hidden.device)
        self.parts.append(hidden[rows, cols])
        for keys, _, _ in picks:
            for key in keys if isinstance(keys, list) else [keys]:
                self.rows[key] = self.count
            self.count += 1

    def hidden(self) -> torch.Tensor:
        return torch.cat(self.parts)


def _prefix_pass(model: LoadedModel, prefixes: list[list[int]], stands_for: list[int], device, stem=None):
    """Left-padded prefixes, each counted `stands_for` times by telemetry -> (hidden [n, width, H],
    cache, padding mask [n, stem + width]). `stem`: (its cache, one row; its length) the prefixes
    continue: the row is repeated for each prefix, and positions start after it."""
    ids, mask = left_pad(prefixes, 0)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache, start = None, 0
    if stem is not None:
        cache, start = copy.deepcopy(stem[0]), stem[1]
        cache.batch_select_indices(torch.zeros(len(prefixes), dtype=torch.long, device=device))
        mask = torch.cat([torch.ones(len(prefixes), start, dtype=torch.long), mask], 1)
    with model.counted.positions(mask[:, start:] * torch.tensor(stands_for)[:, None]):
        out = model.decoder()(input_ids=ids.to(device), attention_mask=mask.to(device),
                              position_ids=(positions + start).to(device), cache=cache, use_cache=True)
    return out.last_hidden_state, out.cache, mask


def _suffix_pass(model: LoadedModel, suffixes: list[list[int]], starts: list[int], cache, cache_rows: list[int],
                 prefix_mask: torch.Tensor | None, device) -> torch.Tensor:
    """Right-padded suffixes (harmless: causal, so without a cache no mask is passed; telemetry
    still learns which positions are real) starting at positions `starts`, each attending to row
    `cache_rows[i]` of the prefix cache -> hidden [n, width, H]."""
    ids = right_pad(suffixes)
    width = ids.shape[1]
    positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
    real = (torch.arange(width)[None, :] < torch.tensor([len(s) for s in suffixes])[:, None]).long()
    mask = None
    if cache is not None:
        index = torch.tensor(cache_rows)
        cache.batch_select_indices(index.to(device))
        mask = torch.cat([prefix_mask[index], real], 1).to(device)
    with model.counted.positions(real):
        out = model.decoder()(input_ids=ids.to(device), attention_mask=mask, position_ids=positions.to(device),
                              cache=cache, use_cache=False)
    return out.last_hidden_state


def _run_forwards(model: LoadedModel, docs: Sequence[Requests], shared: list[int], context_per_option: bool,
                  device) -> _ScoredPositions:
    scored = _ScoredPositions()
    for members, stem_len in stems(docs, shared):
        if not stem_len and tree_masks_exact(model, [docs[d] for d in members]):
            _run_trees(model, docs, members, shared, context_per_option, device, scored)
            continue
        stem = None
        if stem_len:
            # telemetry counts the stem once per document (per option), as if each had computed it
            counts = [sum(len(docs[d].inputs) if context_per_option else 1 for d in members)]
            _, stem_cache, _ = _prefix_pass(model, [docs[members[0]].inputs[0][:stem_len]], counts, device)
            stem = stem_cache, stem_len
        _run_documents(model, docs, members, shared, stem, context_per_option, device, scored)
    return scored


def _run_documents(model: LoadedModel, docs: Sequence[Requests], members: list[int], shared: list[int], stem,
                   context_per_option: bool, device, scored: _ScoredPositions) -> None:
    """Documents' own prefixes (after their stem, when they have one), then their choices' rest."""
    start = stem[1] if stem else 0
    order = sorted(members, key=lambda d: -shared[d])
    # after a stem, padding would sit between it and a prefix, and a sliding window counts cache
    # slots, not positions: runs of equal lengths only
    for group in padded_runs(order, lambda d: shared[d] - start, 0 if stem else FORWARD_COST):
        cache, prefix_mask = None, None
        if shared[group[0]]:
            stands_for = [len(docs[d].inputs) if context_per_option else 1 for d in group]
            hidden, cache, prefix_mask = _prefix_pass(model, [docs[d].inputs[0][start:shared[d]] for d in group],
                                                      stands_for, device, stem)
            width, picks = hidden.shape[1], []
            for row, d in enumerate(group):
                doc = docs[d]
                positions = {p for seq, clen in zip(doc.inputs, doc.cont_lens)
                             for p in range(len(seq) - clen, min(len(seq), shared[d]))}
                picks += [((d, p), row, width - shared[d] + p) for p in sorted(positions)]
            scored.add(hidden, picks)
        cache_row = {d: row for row, d in enumerate(group)}
        rest = sorted(((d, c) for d in group for c, seq in enumerate(docs[d].inputs) if len(seq) > shared[d]),
                      key=lambda dc: shared[dc[0]] - len(docs[dc[0]].inputs[dc[1]]))
        runs = padded_runs(rest, lambda dc: len(docs[dc[0]].inputs[dc[1]]) - shared[dc[0]])
        for i, run in enumerate(runs):
            # selecting cache rows replaces the cache's tensors: every run but the last gets a copy
            run_cache = copy.deepcopy(cache) if cache is not None and i < len(runs) - 1 else cache
            hidden = _suffix_pass(model, [docs[d].inputs[c][shared[d]:] for d, c in run], [shared[d] for d, _ in run],
                                  run_cache, [cache_row[d] for d, _ in run], prefix_mask, device)
            picks = []
            for row, (d, c) in enumerate(run):
                seq, clen = docs[d].inputs[c], docs[d].cont_lens[c]
                picks += [((d, c, p), row, p - shared[d]) for p in range(max(len(seq) - clen, shared[d]), len(seq))]
            scored.add(hidden, picks)


@dataclass
class _Tree:
    """One document's fed sequences as a trie: node i feeds tokens[i] at position depths[i] after
    node parents[i] (-1: none); nodes[c][p] is choice c's node at position p; weights[i] what node i
    counts for in telemetry (as the cached path counts: a shared context once per document, or once
    per option with `context_per_option`, and each choice's own tokens once per choice)."""
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    nodes: list[list[int]]
    weights: list[int]


def _trie(doc: Requests, shared: int, context_per_option: bool) -> _Tree:
    index: dict[tuple[int, int], int] = {}
    tree = _Tree([], [], [], [], [])
    for seq in doc.inputs:
        parent, path = -1, []
        for p, token in enumerate(seq):
            node = index.get((parent, token))
            if node is None:
                node = index[parent, token] = len(tree.tokens)
                tree.tokens.append(token)
                tree.parents.append(parent)
                tree.depths.append(p)
                tree.weights.append(0)
            tree.weights[node] += 1 if context_per_option or p >= shared or not tree.weights[node] else 0
            path.append(node)
            parent = node
        tree.nodes.append(path)
    return tree


def tree_masks_exact(model: LoadedModel, docs: Sequence[Requests]) -> bool:
    """Whether documents may run as tries under a mask of their own (`_run_trees`): the attention
    must take a 4D mask as given (sdpa's boolean, eager's additive; flash kernels take none), and a
    sliding window must not cut any sequence, for the mask says nothing of windows."""
    config = model.decoder().config
    window = getattr(config, "sliding_window", None)
    return (config._attn_implementation in ("sdpa", "eager") and not getattr(config, "attention_chunk_size", None)
            and not getattr(config, "use_bidirectional_attention", False)
            and (window is None or max(len(seq) for doc in docs for seq in doc.inputs) <= window))


def _tree_rows(sizes: list[int], key_cost: float) -> tuple[int, list[list[int]]]:
    """(row width, rows of tree indices): trees packed first-fit, largest first, into rows of the
    width whose padded positions cost least, each position costing 1 + key_cost per key it attends
    over (the mask makes every position attend over its whole row)."""
    order = sorted(range(len(sizes)), key=lambda t: -sizes[t])
    best = None
    for width in sorted({max(sizes[order[0]], w) for w in TREE_WIDTHS}):
        rows, room = [], []
        for t in order:
            fit = next((r for r, free in enumerate(room) if free >= sizes[t]), None)
            if fit is None:
                rows.append([t])
                room.append(width - sizes[t])
            else:
                rows[fit].append(t)
                room[fit] -= sizes[t]
        cost = len(rows) * width * (1 + key_cost * width)
        if best is None or cost < best[0]:
            best = cost, width, rows
    return best[1], best[2]


def _key_cost(model: LoadedModel) -> float:
    """Attention's FLOPs per key attended (QK^T and AV) over a position's other FLOPs per layer."""
    config, decoder = model.decoder().config, model.decoder()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = getattr(decoder, "layers", None)
    params = sum(p.numel() for p in layers[0].parameters()) if layers else 12 * config.hidden_size ** 2
    return 2 * heads * head_dim / params


def _run_trees(model: LoadedModel, docs: Sequence[Requests], members: list[int], shared: list[int],
               context_per_option: bool, device, scored: _ScoredPositions) -> None:
    """Each document's distinct tokens once, as its trie laid out in one row next to other documents'
    tries, every node attending to itself and its ancestors at its own position: a choice's tokens
    see exactly the keys and rotary positions of its own sequence, with no padding between tries
    and no KV cache. Rows of a width picked by `_tree_rows`, TREE_ROW_TOKENS positions a forward."""
    trees = [_trie(docs[d], shared[d], context_per_option) for d in members]
    width, rows = _tree_rows([len(t.tokens) for t in trees], _key_cost(model))
    per_forward = max(1, TREE_ROW_TOKENS // width)
    config = model.decoder().config
    for first in range(0, len(rows), per_forward):
        batch = rows[first:first + per_forward]
        n = len(batch)
        ids = torch.zeros((n, width), dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        parents = torch.full((n, width), -1, dtype=torch.long)
        weights = torch.zeros((n, width), dtype=torch.long)
        picks, fill = [], 0
        for row, members_of_row in enumerate(batch):
            offset = 0
            for t in members_of_row:
                tree, d, size = trees[t], members[t], len(trees[t].tokens)
                ids[row, offset:offset + size] = torch.tensor(tree.tokens)
                positions[row, offset:offset + size] = torch.tensor(tree.depths)
                parents[row, offset:offset + size] = torch.tensor([q + offset if q >= 0 else -1 for q in tree.parents])
                weights[row, offset:offset + size] = torch.tensor(tree.weights)
                keys: dict[int, list[tuple]] = {}
                for c, (seq, clen) in enumerate(zip(docs[d].inputs, docs[d].cont_lens)):
                    for p in range(len(seq) - clen, len(seq)):
                        keys.setdefault(tree.nodes[c][p], []).append((d, p) if p < shared[d] else (d, c, p))
                picks += [(node_keys, row, offset + node) for node, node_keys in keys.items()]
                offset += size
            fill = max(fill, offset)
        # the columns no row of this forward fills are not run
        ids, positions, parents, weights = (t[:, :fill] for t in (ids, positions, parents, weights))
        # ancestors by walking every node's parent chain one step per pass (depth passes)
        allowed = torch.eye(fill, dtype=torch.bool).repeat(n, 1, 1)
        at = parents.clone()
        while True:
            r, c = (at >= 0).nonzero(as_tuple=True)
            if not len(r):
                break
            up = at[r, c]
            allowed[r, c, up] = True
            at[r, c] = parents[r, up]
        mask = allowed[:, None]
        if config._attn_implementation == "eager":
            dtype = next(model.model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        with model.counted.positions(weights):
            out = model.decoder()(input_ids=ids.to(device), attention_mask=mask.to(device),
                                  position_ids=positions.to(device), use_cache=False)
        scored.add(out.last_hidden_state, picks)


@torch.inference_mode()
def score_documents(model: LoadedModel, docs: Sequence[Requests], context_per_option: bool = False,
                    **head) -> list[list[tuple[float, bool]]]:
    """Per document, per choice: (sum log p(continuation), continuation is the greedy decode).
    `context_per_option`: telemetry counts a shared context once per choice (numerics unchanged).
    `head`: head.token_logprobs's blocking (rows, vocab_block)."""
    device = model.device
    shared = [common_prefix_len(doc.inputs) for doc in docs]
    scored = _run_forwards(model, docs, shared, context_per_option, device)
    hidden = scored.hidden()

    entry_rows, targets = [], []
    for d, doc in enumerate(docs):
        for c, (seq, clen, cont) in enumerate(zip(doc.inputs, doc.cont_lens, doc.conts)):
            for p, target in zip(range(len(seq) - clen, len(seq)), cont):
                entry_rows.append(scored.rows[(d, p) if p < shared[d] else (d, c, p)])
                targets.append(target)
    entry_rows = torch.tensor(entry_rows, device=device)
    targets = torch.tensor(targets, device=device)

    token_lp, greedy = token_logprobs(model, hidden, targets, entry_rows, **head)
    token_lp, greedy = token_lp.tolist(), greedy.tolist()

    out, pos = [], 0
    for doc in docs:
        scores = []
        for clen in doc.cont_lens:
            scores.append((sum(token_lp[pos:pos + clen]), all(greedy[pos:pos + clen])))
            pos += clen
        out.append(scores)
    return out


@dataclass
class _Doc:
    inputs: list[list[int]]
    cont_lens: list[int]
    conts: list[list[int]]


def score_choices(model: LoadedModel, inputs: list[list[int]], cont_lens: list[int], conts: list[list[int]]
                  ) -> list[tuple[float, bool]]:
    """`score_documents` for a single document's requests."""
    return score_documents(model, [_Doc(inputs, cont_lens, conts)])[0]
