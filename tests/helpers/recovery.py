"""Recovery jobs' overrides and their training text."""

from __future__ import annotations

TEXT = "The quick brown fox jumps over the lazy dog. Question: What is the capital of France? Answer: Paris. "


def recovery_overrides(path, *more) -> list[str]:
    """A quick recovery on the text file: 32-token windows, 2 micro-batches of 2 a step."""
    return ["recovery=lora", "recovery.data=file", f"recovery.path={path}", "recovery.seq_len=32",
            "recovery.batch_size=4", "recovery.micro_batch_size=2", "recovery.val_samples=4",
            "recovery.warmup_steps=0", *more]



# one optimizer step of any recipe on a little data: 32-token examples, 2 a step, 2 held out
ONE_STEP = ["recovery.seq_len=32", "recovery.batch_size=2", "recovery.micro_batch_size=2", "recovery.val_samples=2",
            "recovery.max_steps=1", "recovery.warmup_steps=0", "recovery.val_every=1", "recovery.schedule_steps=null",
            "recovery.n_samples=null"]
