"""Pruners: `score` once (expensive, cacheable), `apply` per sparsity (cheap)."""
