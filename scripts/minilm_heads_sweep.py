"""Head pruning on all-MiniLM-L6-v2 (a sentence encoder with no LM or task head): how much of its
behaviour survives heads_random, heads_his and hies at several ratios.

prunebench has no encoder task yet (GLUE comes with its own issue), so quality is measured on
what the model is for, sentence embeddings (mean pooling, L2 normalised, as its
sentence-transformers config says), over a fixed input set:
- fidelity: mean cosine between the pruned and the dense model's embedding of each text;
- retrieval: ARC-Easy answered by embedding similarity (the choice closest to the question),
  a task the dense model does well above chance (25%).
HIS needs a loss; the model's own training objective is an in-batch contrastive loss over
(text, positive) pairs (MultipleNegativesRankingLoss), used here on OpenBookQA (question, correct
answer) pairs, a dataset disjoint from the evaluated ARC-Easy questions.

    .venv/bin/python scripts/minilm_heads_sweep.py [--data ../shared/data] [--questions 500] [--normalize none]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from prunebench.models.encoder import load_minilm_l6
from prunebench.models.attention import attention_heads
from prunebench.pruners.heads import (HIESPruner, HISPruner, RandomHeadPruner, choose_pruned, head_statistics,
                                      prune_heads)

SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss default


def embed(model, tokenizer, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=128, return_tensors="pt")
            out.append(pool(model(**enc).last_hidden_state, enc["attention_mask"]))
    return torch.cat(out)


def pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    summed = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
    return F.normalize(summed, dim=-1)


def contrastive_loss(model, batch) -> torch.Tensor:
    """In-batch MultipleNegativesRankingLoss: the first half of the rows are anchors, the second
    half their positives, every other positive a negative."""
    emb = pool(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state,
               batch["attention_mask"])
    anchors, positives = emb.chunk(2)
    return F.cross_entropy(SCALE * anchors @ positives.T, torch.arange(len(anchors)))


def obqa_pairs(data: Path, n: int) -> list[tuple[str, str]]:
    pairs = []
    for line in (data / "openbookqa" / "test.jsonl").read_text().splitlines()[:n]:
        doc = json.loads(line)
        pairs.append((doc["question_stem"], doc["choices"]["text"][doc["choices"]["label"].index(doc["answerKey"])]))
    return pairs


def arc_easy(data: Path, n: int) -> list[tuple[str, list[str], int]]:
    docs = []
    for line in (data / "arc" / "ARC-Easy-Test.jsonl").read_text().splitlines()[:n]:
        doc = json.loads(line)
        choices = doc["question"]["choices"]
        docs.append((doc["question"]["stem"], [c["text"] for c in choices],
                     [c["label"] for c in choices].index(doc["answerKey"])))
    return docs


def pair_batches(tokenizer, pairs: list[tuple[str, str]], batch_size: int) -> list[dict]:
    batches = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        enc = tokenizer([a for a, _ in chunk] + [p for _, p in chunk], padding=True, return_tensors="pt")
        batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return batches


def quality(model, tokenizer, docs, dense_emb: torch.Tensor) -> dict[str, float]:
    questions = embed(model, tokenizer, [q for q, _, _ in docs])
    choices = embed(model, tokenizer, [c for _, cs, _ in docs for c in cs]).split([len(cs) for _, cs, _ in docs])
    correct = sum(int(torch.argmax(c @ q)) == gold for q, c, (_, _, gold) in zip(questions, choices, docs))
    return {"retrieval_acc": correct / len(docs), "fidelity": float((questions * dense_emb).sum(-1).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--normalize", choices=["layer", "none"], default="layer", help="HIS per-layer normalisation")
    args = parser.parse_args()

    loaded = load_minilm_l6(name="minilm-l6")
    model, tok = loaded.model, loaded.tokenizer
    docs = arc_easy(args.data, args.questions)
    batches = pair_batches(tok, obqa_pairs(args.data, args.pairs), batch_size=8)
    stats = head_statistics(model, batches, his=True, entropy=True, loss_fn=contrastive_loss)
    dense_emb = embed(model, tok, [q for q, _, _ in docs])
    dense = quality(model, tok, docs, dense_emb)
    print(f"dense: {dense}  ({sum(len(s) for s in stats['his'])} heads; {args.questions} ARC-Easy questions, "
          f"{args.pairs} OpenBookQA calibration pairs)")
    pruners = {"heads_his": [(HISPruner(normalize=args.normalize), stats)],
               "hies": [(HIESPruner(alpha=0.5, normalize=args.normalize), stats)],
               "heads_random": [(RandomHeadPruner(seed=s), RandomHeadPruner(seed=s).score(loaded)) for s in args.seeds]}
    print("| pruner | heads removed | retrieval acc | fidelity (cos to dense) | params removed |")
    print("|---|---|---|---|---|")
    for ratio in args.ratios:
        for name, variants in pruners.items():
            results = []
            for pruner, scores in variants:
                pruned = copy.deepcopy(model)
                heads = attention_heads(pruned)
                before = sum(p.numel() for p in pruned.parameters())
                prune_heads(pruned, heads, choose_pruned(pruner.importance(scores), ratio), "remove")
                after = sum(p.numel() for p in pruned.parameters())
                results.append({**quality(pruned, tok, docs, dense_emb), "params": 1 - after / before})
            mean = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
            label = name if len(results) == 1 else f"{name} (mean of {len(results)} seeds)"
            print(f"| {label} | {ratio:.0%} | {mean['retrieval_acc']:.3f} | {mean['fidelity']:.4f} "
                  f"| {mean['params']:.1%} |")


if __name__ == "__main__":
    main()
