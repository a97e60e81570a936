"""prunebench: how much quality a pruned model keeps, and what the pruning buys in speed."""

__version__ = "0.1.0"
