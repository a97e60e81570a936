"""The `classify` request kind: `engine.py` (a classifier's logits over a task's labels)."""
