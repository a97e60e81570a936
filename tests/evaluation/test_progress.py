"""Progress wherever a job runs: in a terminal a bar whose clock ticks between batches and whose ETA
weighs documents by their positions; elsewhere (SLURM, nohup, a pipe) a log line every 30 s or every
10% of the work. Clocks are injected: nothing here depends on how fast the machine is."""

from __future__ import annotations

import io
import logging
import threading

import pytest

from conftest import TINY_MC, compose_cfg
from prunebench import job
from prunebench.evaluation.progress import DocumentProgress, Progress, Ticker, duration

LOGGER = "prunebench.evaluation.progress"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    return lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_without_a_terminal_a_line_comes_every_30_s_or_every_tenth_of_the_work(lines):
    clock = FakeClock()
    progress = Progress("arc_easy", 100, 1000, interactive=False, clock=clock)
    assert lines() == ["arc_easy: 100 documents to score (1000 positions)"]
    clock.now = 10.0
    progress.advance(1, 50)  # 5% of the work after 10 s: no line yet
    clock.now = 29.0
    progress.tick()
    assert len(lines()) == 1
    clock.now = 30.0  # no batch ended, yet half a minute passed: a line
    progress.tick()
    # the ETA by positions: 30 s x 950 / 50
    assert lines()[-1] == "arc_easy: 1/100 documents (5% of the work), 30 s elapsed, ETA 9 min 30 s"
    clock.now = 31.0
    progress.advance(2, 50)  # 10% of the work: a line, though only 1 s passed
    assert lines()[-1] == "arc_easy: 3/100 documents (10% of the work), 31 s elapsed, ETA 4 min 39 s"
    clock.now = 40.0
    progress.advance(3, 30)  # 13%: neither 30 s nor the next tenth
    progress.tick()
    assert len(lines()) == 3
    clock.now = 41.0
    progress.advance(94, 870)  # 100% jumps several tenths: one line
    assert lines()[-1] == "arc_easy: 100/100 documents (100% of the work), 41 s elapsed, ETA 0 s"
    clock.now = 42.0
    progress.close()
    assert lines()[-1] == "arc_easy: 100 documents done in 42 s"
    assert len(lines()) == 5


def test_the_eta_weighs_documents_by_their_positions():
    """Longest documents first: the first batch holds 1% of the documents but half the work. By
    documents the ETA would be 99 x 60 s; by positions it is 60 s."""
    clock = FakeClock()
    progress = Progress("arc_easy", 100, 2000, interactive=False, clock=clock)
    clock.now = 60.0
    progress.advance(1, 1000)
    assert progress.eta() == pytest.approx(60.0)


def test_without_a_cost_each_document_is_one_unit_of_work(lines):
    clock = FakeClock()
    progress = Progress("wikitext2_ppl", 4, None, interactive=False, clock=clock)
    clock.now = 5.0
    progress.advance(1)
    assert lines()[-1] == "wikitext2_ppl: 1/4 documents (25% of the work), 5 s elapsed, ETA 15 s"


def test_in_a_terminal_the_bar_counts_positions_shows_documents_and_its_clock_ticks_between_batches():
    out = io.StringIO()
    progress = Progress("arc_easy", 100, 1000, interactive=True, file=out)
    progress.advance(3, 250)
    assert (progress.bar.n, progress.bar.total) == (250, 1000)
    assert "3/100 docs" in out.getvalue().rsplit("\r", 1)[-1]
    drawn = out.getvalue().count("\r")
    progress.tick()  # no batch ended: the bar is drawn again, its elapsed time and ETA new
    assert out.getvalue().count("\r") == drawn + 1
    progress.close()


def test_the_ticker_calls_until_stopped():
    called = threading.Event()
    ticker = Ticker(called.set, interval=0.01)
    ticker.start()
    assert called.wait(60)  # returns as soon as the first tick came
    ticker.stop()
    assert not ticker.is_alive()


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (40, 310, 4920)] == ["40 s", "5 min 10 s", "1 h 22 min"]


def test_a_job_reports_its_progress_in_positions_without_a_terminal(tmp_path, store, lines, monkeypatch):
    """The real engine and data module: the total is the positions its batches are packed by, and
    the last line has every document done."""
    cfg = compose_cfg([*TINY_MC, "pruner=none", "trainer.enable_progress_bar=true", "limit=4"])
    seen = {}
    original = DocumentProgress.on_test_start

    def spy(self, trainer, pl_module):
        seen["positions"] = sum(trainer.datamodule.cost(doc) for batch in trainer.datamodule.batches for doc in batch)
        original(self, trainer, pl_module)

    monkeypatch.setattr(DocumentProgress, "on_test_start", spy)
    job.run(cfg)
    assert seen["positions"] > 4  # the documents have more than one position each
    assert lines()[0] == f"local_mc: 4 documents to score ({seen['positions']} positions)"
    assert lines()[-2].startswith("local_mc: 4/4 documents (100% of the work), ")
    assert lines()[-1].startswith("local_mc: 4 documents done in ")
