"""Ctrl-C remembered. Some libraries swallow the KeyboardInterrupt it raises (a bare `except:` around
an import probe), and a sweep's job then ran on and ended FINISHED, and the sweep went on to its next
job, as if no one had asked it to stop. The handler records the signal before raising, and a job
checks the record where it would end well (`check`): a swallowed Ctrl-C still ends it KILLED."""

from __future__ import annotations

import signal
import threading

received: list[int] = []


def on_sigint(signum: int, frame) -> None:
    received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """Where Python's own handler is in place (not where a caller chose to ignore Ctrl-C)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)


def check() -> None:
    """Raises KeyboardInterrupt when a Ctrl-C came to this process and something swallowed it."""
    if received:
        raise KeyboardInterrupt("Ctrl-C came earlier (a library caught it, the job did not stop then)")
