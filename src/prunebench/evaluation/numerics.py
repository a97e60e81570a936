"""eval.numerics, how log-likelihoods are computed (docs/commonsense.md, "Numerics"): checked by
validate before any model loads, so it imports nothing heavy."""

from __future__ import annotations

NUMERICS = ("fast", "lm_eval")


def lm_eval_rows(options) -> int | None:
    """Rows per forward of `numerics=lm_eval` (lm-eval's batch size), None for the fast scorer; a
    bad value is refused."""
    numerics, rows = options.get("numerics", "fast"), options.get("lm_eval_batch_size", 1)
    if numerics not in NUMERICS:
        raise ValueError(f"eval.numerics={numerics!r}; valid: {list(NUMERICS)} (fast: shared-context KV cache, "
                         f"fp32 log-softmax; lm_eval: lm-eval HFLM's own computation in the model's dtype)")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"eval.lm_eval_batch_size={rows!r}: a positive integer, lm-eval's --batch_size")
    return rows if numerics == "lm_eval" else None
