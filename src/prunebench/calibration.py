"""Calibration data for scorers: token windows drawn deterministically (per seed) from a text corpus.

`stream` sampling cuts random windows from the corpus joined into one token stream (SparseGPT's and
Wanda's WikiText-2 loader); `document` sampling draws a random document longer than a window and a
random window inside it (their C4 loader). Each window starts with BOS when the tokenizer adds one
(see evaluation/perplexity/windows.py), so its activations look like the ones evaluation produces."""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Iterable, Iterator

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.api.errors import ConfigError
from prunebench.api.task_keys import chosen_definition, task_names
from prunebench.corpora import C4, Alpaca, TaskText, TextCorpus, TextFile, WikiText2, task_data_ids
from prunebench.evaluation.encoding import window_prefix

SAMPLING = ("stream", "document")

log = logging.getLogger(__name__)


def piece_tokens(corpus: TextCorpus, tokenizer) -> Iterator[list[int]]:
    """The corpus's tokens, a piece of its text at a time (`TextCorpus.pieces`)."""
    for piece in corpus.pieces():
        yield tokenizer.encode(piece, add_special_tokens=False)


def cut_windows(pieces: Iterable[list[int]], starts: list[int], length: int) -> list[list[int]]:
    """The windows [start, start + length) of the token stream that `pieces` give one after another,
    in the order of `starts`. Only the tokens that a window not yet cut may need are kept: memory is
    the windows', a piece's and one window's, whatever the stream's length."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    windows: list[list[int]] = [[] for _ in starts]
    held, offset, done = [], 0, 0  # `held`: the stream's tokens from position `offset` on
    for ids in pieces:
        held += ids
        end = offset + len(held)
        while done < len(order) and starts[order[done]] + length <= end:
            at = starts[order[done]] - offset
            windows[order[done]] = held[at:at + length]
            done += 1
        keep = min(starts[order[done]], end) if done < len(order) else end
        del held[:keep - offset]
        offset = keep
    return windows


class Calibration:
    """`samples(tokenizer)` -> LongTensor [n_samples, seq_len]; the same seed gives the same windows.

    `allow_eval_split` lets a user calibrate on data that is also evaluated (otherwise refused)."""

    def __init__(self, corpus: TextCorpus, name: str, n_samples: int = 128, seq_len: int = 2048, seed: int = 0,
                 sampling: str = "stream", allow_eval_split: bool = False):
        if sampling not in SAMPLING:
            raise ValueError(f"calib.sampling={sampling!r} is not one of {list(SAMPLING)}")
        if n_samples < 1 or seq_len < 2:
            raise ValueError(f"calib.n_samples={n_samples} and calib.seq_len={seq_len} must be >= 1 and >= 2")
        self.corpus, self.name, self.n_samples, self.seq_len = corpus, name, n_samples, seq_len
        self.seed, self.sampling, self.allow_eval_split = seed, sampling, allow_eval_split

    def check(self) -> None:
        """Raise a clear error if the data cannot be had, before any model loads."""
        self.corpus.check()

    def evaluated_overlap(self, tasks: dict) -> dict[str, set[str]]:
        """{task name: the data it shares with this calibration set}, for the tasks that share any."""
        mine = self.corpus.data_ids()
        shared = {name: mine & task_data_ids(task) for name, task in tasks.items()}
        return {name: ids for name, ids in shared.items() if ids}

    def samples(self, tokenizer) -> torch.Tensor:
        prefix = window_prefix(tokenizer)
        body = self.seq_len - len(prefix)
        rng = random.Random(self.seed)
        if self.sampling == "stream":
            # the stream is read twice, a piece at a time: its length first (the starts are drawn in
            # it), then the windows at those starts; a one-piece text is tokenized once
            pieces = piece_tokens(self.corpus, tokenizer)
            first = next(pieces, [])
            count = len(first) + sum(len(ids) for ids in pieces)
            if count <= body:
                raise ValueError(f"calib {self.name}: {count} tokens cannot fill one window of "
                                 f"seq_len={self.seq_len}")
            starts = [rng.randrange(0, count - body) for _ in range(self.n_samples)]
            windows = cut_windows([first] if count == len(first) else piece_tokens(self.corpus, tokenizer),
                                  starts, body)
        else:
            windows = self.document_windows(tokenizer, body, rng)
        return torch.tensor([prefix + w for w in windows], dtype=torch.long)

    def document_windows(self, tokenizer, body: int, rng: random.Random) -> list[list[int]]:
        docs = self.corpus.documents()
        windows, too_short = [], set()
        while len(windows) < self.n_samples:
            if len(too_short) == len(docs):
                raise ValueError(f"calib {self.name}: no document is longer than seq_len={self.seq_len} tokens")
            index = rng.randrange(len(docs))
            ids = tokenizer.encode(docs[index], add_special_tokens=False)
            if len(ids) > body:
                start = rng.randrange(0, len(ids) - body)
                windows.append(ids[start:start + body])
            else:
                too_short.add(index)
        return windows


class FileCalibration(Calibration):
    """Any local text or .json/.jsonl(.gz) file (calib=file calib.path=FILE)."""

    def __init__(self, path: str, field: str = "text", **kwargs):
        super().__init__(TextFile(path, field), **kwargs)


class WikiText2Calibration(Calibration):
    def __init__(self, split: str = "train", data_dir: str | None = None, **kwargs):
        super().__init__(WikiText2(split, data_dir), **kwargs)


class C4Calibration(Calibration):
    def __init__(self, split: str = "train", path: str | None = None, **kwargs):
        super().__init__(C4(split, path), **kwargs)


class AlpacaCalibration(Calibration):
    def __init__(self, path: str | None = None, **kwargs):
        super().__init__(Alpaca(path), **kwargs)


PROMPT_SUBSETS = ("random", "first")


class PromptCalibration(Calibration):
    """MoP's released calibration: `n_samples` instruction prompts in the MoP code's template, each
    run alone as one batch (no packing, no padding; cut at `seq_len`), so a per-batch average is a
    per-prompt one (pruner.average=batch). `subset`: `random` draws them per seed; `first` takes the
    dataset's first ones in order, as the released LLaMA-3 code does (random_subset=False)."""

    def __init__(self, path: str | None = None, subset: str = "random", **kwargs):
        if subset not in PROMPT_SUBSETS:
            raise ValueError(f"calib.subset={subset!r}; valid: {list(PROMPT_SUBSETS)}")
        super().__init__(Alpaca(path, template="mop"), **kwargs)
        self.subset = subset

    def batches(self, loaded, batch_size: int) -> list[dict[str, torch.Tensor]]:
        docs = self.corpus.documents()
        count = min(self.n_samples, len(docs))
        prompts = docs[:count] if self.subset == "first" else random.Random(self.seed).sample(docs, count)
        out = []
        for text in prompts:
            ids = torch.tensor([loaded.tokenizer(text)["input_ids"][:self.seq_len]], device=loaded.device)
            out.append({"input_ids": ids, **({"labels": ids} if loaded.family == "causal_lm" else {})})
        return out


class TaskCalibration(Calibration):
    """The documents of one benchmark's definition (`task@calib.task=NAME`), pointed at a split that is not evaluated."""

    def __init__(self, task, **kwargs):
        super().__init__(TaskText(task), **kwargs)


class LabelledCalibration:
    """Labelled examples of a classification task (GLUE train, an image train split) for scorers
    that need the task loss (HIS, HIES on classifiers): `batches(loaded, batch_size)` gives model
    inputs with `labels`, which pruners/structured.calibration_batches uses as they are.

    `task`: its definition; left unset in the config it is the evaluated task's own train split
    (calibration_config)."""

    def __init__(self, task, name: str = "labelled", n_samples: int = 32, seed: int = 0,
                 allow_eval_split: bool = False):
        if n_samples < 1:
            raise ValueError(f"calib.n_samples={n_samples} must be >= 1")
        self.task, self.name, self.n_samples, self.seed = task, name, n_samples, seed
        self.allow_eval_split = allow_eval_split

    def check(self) -> None:
        self.task.check()

    def check_labels(self, tasks: dict) -> None:
        """Raise ValueError when an evaluated task names its classes otherwise: HIS computed from
        another task's labels (SST-2's for a CoLA model) would rank heads by the wrong loss. Only
        tasks whose classes the definition names (text classification) are compared."""
        mine = getattr(self.task, "labels", None)
        for name, task in tasks.items():
            theirs = getattr(task, "labels", None)
            if mine is not None and theirs is not None and list(mine) != list(theirs):
                raise ValueError(f"calib={self.name!r} draws labelled examples from task {self.task.name} "
                                 f"({self.task.source.describe()}), labels {list(mine) or ['(regression)']}, but "
                                 f"task {name} is evaluated with labels {list(theirs) or ['(regression)']}; leave "
                                 f"calib.task unset (the evaluated task's own train split) or choose "
                                 f"task@calib.task={name}")

    def evaluated_overlap(self, tasks: dict) -> dict[str, set[str]]:
        mine = task_data_ids(self.task)
        shared = {name: mine & task_data_ids(task) for name, task in tasks.items()}
        return {name: ids for name, ids in shared.items() if ids}

    def batches(self, loaded, batch_size: int) -> list[dict[str, torch.Tensor]]:
        return self.task.labelled_batches(loaded, self.n_samples, self.seed, batch_size)


def calibration_config(cfg: DictConfig) -> DictConfig:
    """`cfg.calib` with its `task` a definition to build: a task option chosen for it becomes its one
    definition (`chosen_definition`), and a labelled calibration without one (no `task`, or only
    overrides of one such as glue_train's split) takes the evaluated task's own on its train split,
    the file it was fine-tuned on, not the evaluated one."""
    calib = cfg.calib
    selected = calib.get("task")
    try:
        chosen = chosen_definition(selected, "calib.task")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if chosen is not selected:  # a task option chosen (task@calib.task=NAME): its one definition
        calib = copy.deepcopy(calib)  # still under the root config, so `${data_dir}` and the like resolve
        with open_dict(calib):
            calib.task = chosen
    target = calib.get("_target_")
    if target is None or not issubclass(get_class(target), LabelledCalibration):
        return calib
    task = calib.get("task")
    if task is not None and task.get("_target_") is not None:
        return calib
    evaluated = task_names(cfg.task)
    if len(evaluated) != 1:
        raise ConfigError(f"calib={calib.name!r} without a task calibrates on the evaluated task's train split, but "
                          f"task={cfg.task.get('name')!r} evaluates {evaluated}; choose one: "
                          f"task@calib.task=NAME")
    if evaluated[0] not in (cfg.task.get("tasks") or {}):
        raise ConfigError(f"calib={calib.name!r} without a task calibrates on the evaluated task's train split, but "
                          f"{evaluated[0]} is an lm-eval task (task.lm_eval), which has no definition here to take it "
                          f"from; name one: task@calib.task=NAME, or calib=file")
    own = cfg.task.tasks[evaluated[0]]
    if "split" not in own.get("source", {}):
        raise ConfigError(f"calib={calib.name!r} without a task calibrates on the evaluated task's train split, but "
                          f"task {evaluated[0]}'s source ({own.source.get('_target_')}) has no split; give its "
                          f"train data: task@calib.task=NAME calib.task.tasks.NAME.source...=...")
    out = copy.deepcopy(calib)  # still under the root config, so `${seed}` and the like resolve
    with open_dict(out):
        out.task = OmegaConf.merge(own, {"source": {"split": "train", "path": None}}, task or {})
    return out


def check_calibration(cfg: DictConfig, tasks: dict, config, deferred: list[str] | None = None) -> None:
    """A calibrating pruner's data, before any model loads: chosen, built and there, labelled to the
    evaluated task where it is labelled, readable by the model (images only for a vision-language
    model, and a vision tower scored on images), not the evaluated documents unless allowed, and
    windows within the positions of the model's `config` (its stated config, None: not known)."""
    from hydra.utils import instantiate

    from prunebench.hub import deferring
    from prunebench.models.pretrained import POSITION_KEYS, position_limit

    if cfg.calib.get("_target_") is None:
        raise ConfigError(f"pruner={cfg.pruner.name!r} needs calibration data, but calib={cfg.calib.name!r}; "
                          f"choose one, e.g. calib=wikitext2 or calib=file calib.path=FILE")
    try:
        calib = instantiate(calibration_config(cfg), _convert_="all")
        with deferring(deferred):
            calib.check()
        if isinstance(calib, LabelledCalibration):
            calib.check_labels(tasks)
    except ConfigError:
        raise
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from err
    except Exception as err:
        raise ConfigError(f"calib={cfg.calib.name!r} is misconfigured: {err}") from err
    with_images = bool(getattr(getattr(calib, "task", None), "doc_to_image", None))
    if with_images and cfg.model.family != "vlm":
        raise ConfigError(f"calib={cfg.calib.name!r} calibrates on images, which model={cfg.model.name!r} "
                          f"(family {cfg.model.family!r}) cannot read; use a text calibration (calib=wikitext2, file, ...)")
    if cfg.pruner.get("tower", "language") != "language" and not with_images:
        raise ConfigError(f"pruner.tower={cfg.pruner.tower} scores the vision tower's heads on images, but "
                          f"calib={cfg.calib.name!r} has none; use calib=image_text (a VQA task's unevaluated split)")
    shared = calib.evaluated_overlap(tasks)
    if shared and not calib.allow_eval_split:
        raise ConfigError(f"calib={cfg.calib.name!r} reads data that is evaluated ({shared}); calibrate on "
                          f"another split or source, or set calib.allow_eval_split=true to do it anyway")
    # a warning, not a refusal: a rotary model runs past its stated positions, and the releases'
    # default (2048) exceeds the small test models' 256
    seq_len, positions = cfg.calib.get("seq_len"), position_limit(config)
    if isinstance(seq_len, int) and positions and seq_len > positions:
        log.warning("calib.seq_len=%d is beyond model=%r's %d positions (%s of its config): its statistics come "
                    "from a model outside its range; set calib.seq_len=%d or less", seq_len, cfg.model.name,
                    positions, " / ".join(POSITION_KEYS), positions)
