"""Signals that stop a job: where they may raise, and Ctrl-C remembered.

Neither Ctrl-C's KeyboardInterrupt nor SIGTERM's exit may start inside an MLflow SQL-store call:
raised there, it left that call's connection holding SQLite's write lock until the process died, so
the job's own KILLED write and every other job's write failed ("database is locked", seen under
scancel), or SQLAlchemy's autoflush turned it into a StatementError and the job's run and cell ended
FAILED, not KILLED; raised in a finalizer SQLAlchemy runs, Python swallowed it ("Exception ignored
in") and the job ran on. There the signal comes again a moment later (`deferred`), by when the call
has most likely returned. A tracking server's call (`tracking=server`) is no such place: it holds no
connection or lock of the job's, the server commits or does not, and MLflow's client retries a
server that is down for minutes (docs/cluster.md), so a signal there raises at once.

Some libraries swallow the KeyboardInterrupt (a bare `except:` around an import probe), and a
sweep's job then ran on and ended FINISHED, and the sweep went on to its next job, as if no one had
asked it to stop. The handler records the signal before raising, and a job checks the record where
it would end well (`check`): a swallowed Ctrl-C still ends it KILLED."""

from __future__ import annotations

import os
import signal
import threading

received: list[int] = []
STORE_MODULES = ("sqlalchemy", "mlflow.store")
# MLflow's HTTP client, under its REST store and its artifact proxy's repository, with the retries
HTTP_MODULES = ("mlflow.utils.rest_utils", "mlflow.utils.request_utils")
AGAIN_S = 0.05


def deferred(signum: int, frame) -> bool:
    """Whether the main thread (`frame`, a handler's) is inside the store's code, not waiting on a
    tracking server; then `signum` comes again AGAIN_S later and the handler returns without raising."""
    modules = []
    while frame is not None:
        modules.append(frame.f_globals.get("__name__", ""))
        frame = frame.f_back
    if not within(modules, STORE_MODULES) or within(modules, HTTP_MODULES):
        return False
    again = threading.Timer(AGAIN_S, os.kill, (os.getpid(), signum))
    again.daemon = True
    again.start()
    return True


def within(modules: list[str], packages: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for module in modules for name in packages)


def on_sigint(signum: int, frame) -> None:
    received.append(signum)
    if not deferred(signum, frame):
        raise KeyboardInterrupt


def install() -> None:
    """Where Python's own handler is in place (not where a caller chose to ignore Ctrl-C)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)


def stopped(err: BaseException) -> bool:
    """Whether `err` ends a job as stopped by a signal: Ctrl-C's KeyboardInterrupt, SIGTERM's
    SystemExit, or any error raised once a Ctrl-C came (a library that caught the KeyboardInterrupt
    and raised its own error in its place)."""
    return isinstance(err, (KeyboardInterrupt, SystemExit)) or bool(received)


def check() -> None:
    """Raises KeyboardInterrupt when a Ctrl-C came to this process and something swallowed it."""
    if received:
        raise KeyboardInterrupt("Ctrl-C came earlier (a library caught it, the job did not stop then)")
