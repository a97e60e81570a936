"""The garbage collector around a process's library imports. torch, transformers, Lightning (with
torchmetrics, torchvision and torch._dynamo) and MLflow leave some 600k long-lived objects: the
collector's passes over them cost a one-document job about 1 s during the imports and 2 s more at
interpreter exit, where every module's objects are swept again (scripts/overhead.py). So a batch of
imports runs with the collector off, and what it added is then frozen (`gc.freeze`, the standard
library's answer for long-lived objects): later passes, and the one at exit, skip it."""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys


@contextlib.contextmanager
def importing():
    """Imports inside run without collection passes; if they added modules, everything alive is then
    frozen. A batch that imported nothing new (a sweep's second job) freezes nothing: it would only
    pin the previous job's garbage for the rest of the process."""
    was_enabled, modules = gc.isenabled(), len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > modules:
            gc.freeze()
            # in any process that froze, whatever started it (a console script, a SLURM or joblib job);
            # once, however many batches froze
            atexit.unregister(close_stores)
            atexit.register(close_stores)
        if was_enabled:
            gc.enable()


def close_stores() -> None:
    """Frozen objects are never finalized by the collector, so the SQLite connections MLflow's SQL
    stores hold would stay open to the end and leave their -wal/-shm files behind: close them."""
    store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")  # none to close if MLflow opened no SQL store
    if store is not None:
        for engine in list(store.SqlAlchemyStore._engine_map.values()):
            engine.dispose()
