"""One progress bar per task that counts documents. Lightning's bar counts batches, and a batch here
holds as many documents as fit the token budget, so it read `1/1 0.00it/s` for a whole task."""

from __future__ import annotations

from collections.abc import Sized

from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader
from tqdm.auto import tqdm


def documents(loader: DataLoader) -> int | None:
    """How many documents a loader yields: its items are documents, or (batch_size=None) batches of them."""
    data = loader.dataset
    if not isinstance(data, Sized):
        return None
    if loader.batch_size is None:
        return sum(len(batch) for batch in data) if all(isinstance(b, Sized) for b in data) else None
    return len(data)


class DocumentProgress(Callback):
    """Advances by the documents a step recorded (`module.records`: one per document, or per window
    for perplexity); hidden when stderr is not a terminal (tqdm's disable=None), where the job's
    summary line is the record."""

    def __init__(self, task: str):
        self.task = task
        self.bar = None

    def on_test_start(self, trainer, pl_module) -> None:
        loaders = trainer.test_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        totals = [documents(loader) for loader in loaders]
        total = None if None in totals else sum(totals)
        self.bar = tqdm(total=total, desc=self.task, unit="doc", disable=None, dynamic_ncols=True, leave=True)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.bar.update(len(pl_module.records) - self.bar.n)

    def on_test_end(self, trainer, pl_module) -> None:
        self.bar.close()
