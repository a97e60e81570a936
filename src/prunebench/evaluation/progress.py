"""Progress per task, wherever the job runs. Lightning's bar counts batches, and a batch here holds as
many documents as fit the token budget, so it read `1/1 0.00it/s` for a whole task.

Documents run longest first, so a count of documents makes a poor clock: the first batches hold a
handful of long documents, and an ETA from them overstates the job several times over.
The work is counted in the positions the model runs (the data module's `cost(item)`, the measure its
batches are packed by), the documents shown beside it; the ETA is elapsed x remaining / done work.

In a terminal: a tqdm bar whose clock ticks each second even while no batch ends. Elsewhere (SLURM,
nohup, a pipe), where a bar would be one line rewritten in a file: a log line every `every_s`
seconds or every `every_share` of the work, whichever comes first."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sized

from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

log = logging.getLogger(__name__)


def documents(loader: DataLoader) -> int | None:
    """How many documents a loader yields: its items are documents, or (batch_size=None) batches of them."""
    data = loader.dataset
    if not isinstance(data, Sized):
        return None
    if loader.batch_size is None:
        return sum(len(batch) for batch in data) if all(isinstance(b, Sized) for b in data) else None
    return len(data)


def work(loader: DataLoader, cost: Callable | None) -> int | None:
    """The positions of every document the loader yields, by the data module's `cost`; None where
    the module has none (classifier examples: an input is not a count of positions)."""
    if cost is None or not isinstance(loader.dataset, Sized):
        return None
    if loader.batch_size is not None:  # its items are the documents (perplexity's windows)
        return sum(cost(item) for item in loader.dataset)
    return sum(cost(item) for batch in loader.dataset for item in batch)


def positions(data) -> int | None:
    """The positions a set-up data module's evaluation runs, as the progress bar counts them: what
    the job logs (`time/eval_positions`, the measure of its speed) and the plan multiplies by a speed."""
    return work(data.test_dataloader(), getattr(data, "cost", None))


def duration(seconds: float) -> str:
    """`1 h 22 min`, `5 min 10 s`, `40 s`: what a log line is read for."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds} s"


class Progress:
    """One task's progress: `advance(documents, work)` after each batch, `tick()` every second.
    `interactive`: a tqdm bar on `file`, else log lines; `clock`: injected by tests."""

    def __init__(self, task: str, total_documents: int | None, total_work: int | None, interactive: bool,
                 clock: Callable[[], float] = time.monotonic, every_s: float = 30.0, every_share: float = 0.1,
                 file=None):
        self.task, self.total_documents = task, total_documents
        # without a cost, a document is the unit of work
        self.total_work = total_work if total_work is not None else total_documents
        self.clock, self.every_s, self.every_share = clock, every_s, every_share
        self.documents = self.work = 0
        self.start = self.last_line = clock()
        self.last_step = 0  # the last `every_share` step a line was written at
        self.lock = threading.Lock()
        self.bar, self.positions = None, total_work is not None
        if interactive:
            # smoothing=0: the rate is done / elapsed since the start, which is the honest ETA here
            shown = ("{desc}: {n_fmt} docs [{elapsed}]" if not self.total_work else
                     "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                     + ("positions{postfix}" if self.positions else "docs") + " [{elapsed}<{remaining}]")
            self.bar = tqdm(total=self.total_work, desc=task, bar_format=shown, smoothing=0, unit_scale=self.positions,
                            dynamic_ncols=True, leave=True, file=file or sys.stderr,
                            postfix=self.counted() if self.positions else None)
        else:
            log.info("%s: %s documents to score%s", task, "?" if total_documents is None else total_documents,
                     f" ({total_work} positions)" if total_work is not None else "")

    def counted(self) -> str:
        return f"{self.documents}/{self.total_documents if self.total_documents is not None else '?'} docs"

    def eta(self) -> float | None:
        if not self.work or not self.total_work:
            return None
        return (self.clock() - self.start) * (self.total_work - self.work) / self.work

    def advance(self, documents: int, work: int | None = None) -> None:
        """`work`: the positions those documents cost; None counts each document as one."""
        with self.lock:
            self.documents += documents
            step = documents if work is None else work
            self.work += step
            if self.bar is not None:
                if self.positions:
                    self.bar.set_postfix_str(self.counted(), refresh=False)
                self.bar.update(step)
        self.tick()

    def tick(self) -> None:
        """The bar redrawn (its elapsed time and ETA move while a long batch runs); elsewhere a line
        when `every_s` passed since the last one or the work crossed the next `every_share`."""
        with self.lock:
            if self.bar is not None:
                self.bar.refresh()
                return
            share = self.work / self.total_work if self.total_work else 0.0
            step = math.floor(share / self.every_share + 1e-9)  # 0.3 / 0.1 is 2.9999999999999996
            now = self.clock()
            if now - self.last_line >= self.every_s or step > self.last_step:
                self.last_line, self.last_step = now, step
                self.line(now, share)

    def line(self, now: float, share: float) -> None:
        eta = self.eta()
        log.info("%s: %s (%.0f%% of the work), %s elapsed, ETA %s", self.task, self.counted().replace("docs", "documents"),
                 share * 100, duration(now - self.start), "unknown" if eta is None else duration(eta))

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()
            else:
                log.info("%s: %d documents done in %s", self.task, self.documents, duration(self.clock() - self.start))


class Ticker(threading.Thread):
    """Calls `tick` every `interval` seconds until stopped. Hand-written: tqdm redraws only on
    update, and its monitor thread only adjusts miniters."""

    def __init__(self, tick: Callable[[], None], interval: float = 1.0):
        super().__init__(daemon=True, name="prunebench-progress")
        self.tick_fn, self.interval, self.stopped = tick, interval, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.tick_fn()

    def stop(self) -> None:
        self.stopped.set()
        self.join()


class DocumentProgress(Callback):
    """Advances by the documents a step recorded (`module.records`: one per document, or per window
    for perplexity) and the positions its batch cost (`trainer.datamodule.cost(item)` where the module
    has one). `total_work`: the module's `positions`, counted once by the caller (which logs them
    too); None counts documents. `interactive`: None asks whether stderr is a terminal."""

    def __init__(self, task: str, total_work: int | None, interactive: bool | None = None):
        self.task, self.total_work = task, total_work
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.progress: Progress | None = None
        self.ticker: Ticker | None = None
        self.cost = None

    def on_test_start(self, trainer, pl_module) -> None:
        loaders = trainer.test_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        self.cost = getattr(trainer.datamodule, "cost", None) if self.total_work is not None else None
        totals = [documents(loader) for loader in loaders]
        self.progress = Progress(self.task, None if None in totals else sum(totals), self.total_work, self.interactive)
        self.ticker = Ticker(self.progress.tick)
        self.ticker.start()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        done = len(pl_module.records) - self.progress.documents
        self.progress.advance(done, sum(self.cost(item) for item in batch) if self.cost else None)

    def on_test_end(self, trainer, pl_module) -> None:
        self.ticker.stop()
        self.progress.close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.ticker is not None and self.ticker.is_alive():
            self.ticker.stop()
