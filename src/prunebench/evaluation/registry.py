"""One engine per request kind, found by the kind: the job asks here for the engine of a task's
`kind`, never the task. An engine is a function (task, model adapter, limit, eval options) ->
(LightningDataModule, LightningModule) whose module, after Trainer.test, holds `records` (one per
document, predictions/<task>.jsonl) and answers `stderr(metric)`.

Built-in engines are named by import path and imported when first asked for, so importing the
registry loads no engine (nor anything an engine imports)."""

from __future__ import annotations

from collections.abc import Callable

from hydra.utils import get_method

from prunebench.api.requests import CLASSIFY, GENERATE_UNTIL, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING

Engine = Callable  # (task, model: LoadedModel, limit: int | None, options) -> (datamodule, module)

ENGINES: dict[str, str | Engine] = {
    LOGLIKELIHOOD: "prunebench.evaluation.loglikelihood.engine.evaluation",
    LOGLIKELIHOOD_ROLLING: "prunebench.evaluation.perplexity.engine.evaluation",
    GENERATE_UNTIL: "prunebench.evaluation.generation.engine.evaluation",
    CLASSIFY: "prunebench.evaluation.classification.engine.evaluation",
}


def register(kind: str, engine: str | Engine) -> None:
    """Adds the engine of a new request kind (or replaces one): a function, or its import path."""
    ENGINES[kind] = engine


def engine_for(kind: str) -> Engine:
    if kind not in ENGINES:
        raise KeyError(f"no engine for request kind {kind!r}; registered: {sorted(ENGINES)}")
    engine = ENGINES[kind]
    return get_method(engine) if isinstance(engine, str) else engine


def evaluation(task, model, limit: int | None, options) -> tuple:
    """The (LightningDataModule, LightningModule) pair that evaluates `task` in Trainer.test, its
    prompts in the chat format the options ask for (chat.py)."""
    from prunebench.evaluation.chat import prepare

    prepare(task, model, options)
    return engine_for(task.kind)(task, model, limit, options)


def prepared(task, model, limit: int | None, options) -> tuple:
    """`evaluation`'s pair, its data set up, and the positions it will run (progress.positions; None
    where the engine counts none): what a job evaluates, and what a plan counts on a model adapter
    without weights (models/stated.py's Unloaded), by the same engine."""
    from prunebench.evaluation.progress import positions

    data, module = evaluation(task, model, limit, options)
    data.setup("test")  # (again in Trainer.test: each data module sets itself up once)
    return data, module, positions(data)
