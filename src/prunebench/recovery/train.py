"""Recovery fine-tuning in Lightning's Trainer.fit, then the model a user would deploy.

LoRA comes from peft; gradient accumulation, clipping, validation, early stopping and the progress
bar from Lightning; the learning-rate schedule from transformers (the schedules the released recipes
name). After training, the adapter is merged into the pruned weights (a structured model keeps its
narrowed shapes: a LoRA delta has the shape of the weight it is added to) and every weight that was
zero before recovery is zero again: a LoRA delta is dense, so merging it alone would undo an
unstructured or N:M pruning. What that re-masking costs is measured on the held-out examples
(`recovery/loss_unmerged` against `recovery/loss_deployed`)."""

from __future__ import annotations

import logging
import math
import time
import warnings
from pathlib import Path

import lightning as L
import mlflow
import torch
import torch.nn.functional as F
import torchmetrics
from hydra.utils import instantiate
from mlflow.entities import Metric
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from prunebench.bench import memory
from prunebench.models.loaded import LoadedModel
from prunebench.recovery import ADAPTER
from prunebench.recovery.data import IGNORED, RecoveryData

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoints/last.ckpt"  # in the recovery folder: the latest, each replacing the one before
BATCH = 1000  # metric values per MLflow log_batch call, its limit


def collate(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded micro-batch: padding has no attention and no label, so its id does not matter.
    Training examples carry their optimizer step's labelled tokens (`step_items`), which the
    micro-batch passes on."""
    ids = [torch.tensor(e["input_ids"]) for e in examples]
    batch = {"input_ids": pad_sequence(ids, batch_first=True),
             "attention_mask": pad_sequence([torch.ones_like(i) for i in ids], batch_first=True),
             "labels": pad_sequence([torch.tensor(e["labels"]) for e in examples], batch_first=True,
                                    padding_value=IGNORED)}
    if "step_items" in examples[0]:
        batch["step_items"] = torch.tensor(examples[0]["step_items"])
    return batch


def labelled(example: dict[str, list[int]], objective: str) -> int:
    """The positions whose loss counts: next-token targets (the label of position 0 predicts nothing,
    as transformers' causal-LM loss and its Trainer's `num_items_in_batch` count them); distillation
    scores every labelled position's distribution."""
    labels = example["labels"] if objective == "distill" else example["labels"][1:]
    return sum(label != IGNORED for label in labels)


class SeededSampler(torch.utils.data.Sampler):
    """The training examples in an order drawn from `seed` for each epoch (Lightning calls
    `set_epoch` as one starts), so a recovery resumed from a checkpoint sees the batches the
    interrupted one would have: `skip` examples of its first epoch (those trained on before the
    checkpoint) are left out once. Its length stays the epoch's, as Lightning counts epochs by it."""

    def __init__(self, size: int, seed: int, skip: int = 0):
        super().__init__()
        self.size, self.seed, self.skip, self.epoch = size, seed, skip, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epoch + 1):  # epoch 0's order is what a seeded shuffling DataLoader draws
            order = torch.randperm(self.size, generator=generator).tolist()
        skip, self.skip = self.skip, 0
        return iter(order[skip:])


class StepBatches(torch.utils.data.Sampler):
    """The micro-batches of `sampler`'s order, each example's index paired with the labelled tokens of
    the optimizer step its micro-batch belongs to (`items`: each example's), so that a step's loss
    can be divided by them before its last micro-batch is read. Steps are counted from the epoch's
    start, as Lightning accumulates (the epoch's last step may hold fewer micro-batches); a resumed
    epoch's skipped examples end on a step's boundary (checkpoints are written after a step)."""

    def __init__(self, sampler: SeededSampler, micro: int, accumulate: int, items: list[int]):
        super().__init__()
        self.sampler, self.micro, self.accumulate, self.items = sampler, micro, accumulate, items

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.micro)

    def __iter__(self):
        skipped = self.sampler.skip // self.micro
        order = list(self.sampler)
        batches = [order[i:i + self.micro] for i in range(0, len(order), self.micro)]
        steps: dict[int, int] = {}
        for number, batch in enumerate(batches, skipped):
            steps[number // self.accumulate] = steps.get(number // self.accumulate, 0) + sum(self.items[i] for i in batch)
        for number, batch in enumerate(batches, skipped):
            yield [(i, steps[number // self.accumulate]) for i in batch]


class StepExamples(torch.utils.data.Dataset):
    """The training examples read by (index, its step's labelled tokens), as `StepBatches` yields them."""

    def __init__(self, examples: list):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        index, items = key
        return {**self.examples[index], "step_items": items}


class RecoveryDataModule(L.LightningDataModule):
    """`state_dict` (in a checkpoint): the micro-batches trained on, from which a resumed fit's
    loader skips to where the interrupted one was."""

    def __init__(self, train: list, val: list, micro_batch_size: int, seed: int, accumulate: int = 1,
                 objective: str = "lm"):
        super().__init__()
        self.train, self.val, self.micro_batch_size, self.seed = train, val, micro_batch_size, seed
        self.accumulate, self.items = accumulate, [labelled(e, objective) for e in train]
        self.resumed_batches = 0

    def train_dataloader(self) -> DataLoader:
        per_epoch = math.ceil(len(self.train) / self.micro_batch_size)
        sampler = SeededSampler(len(self.train), self.seed, self.resumed_batches % per_epoch * self.micro_batch_size)
        batches = StepBatches(sampler, self.micro_batch_size, self.accumulate, self.items)
        # its own generator: a loader draws a seed for its workers as each epoch starts, which must
        # not come from the global RNG that dropout draws from (a resumed epoch starts elsewhere)
        return DataLoader(StepExamples(self.train), batch_sampler=batches, collate_fn=collate,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.micro_batch_size, collate_fn=collate)

    def state_dict(self) -> dict:
        return {"batches": self.trainer.lightning_module.batches}

    def load_state_dict(self, state: dict) -> None:
        self.resumed_batches = state["batches"]


class RecoveryModule(L.LightningModule):
    """`objective` lm: the model's own next-token loss; distill: KL(teacher || student) on the
    temperature-softened distributions at the labelled positions, times T^2 (Hinton et al.), so its
    gradients keep their scale across temperatures.

    `loss_scaling` tokens: a micro-batch's summed loss is divided by the labelled tokens of its whole
    optimizer step, so the accumulated gradient is the one batch's token mean (transformers' Trainer
    since 4.46); micro_batches: each micro-batch's mean, averaged (Lightning divides what a step
    returns by the accumulated micro-batches, so the token-scaled loss is returned times them).

    Validation, the next-token loss for both objectives (one number to compare recoveries by):
    `recovery/val_loss` weighs every held-out token alike; `recovery/eval_loss` is the Trainer's
    `eval_loss`, each batch's mean loss averaged over the examples (so batches weigh by their
    examples, whatever their tokens)."""

    def __init__(self, model: torch.nn.Module, options: dict, teacher: torch.nn.Module | None = None):
        super().__init__()
        self.model, self.options, self.teacher = model, options, teacher
        self.val_loss, self.eval_loss = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()
        self.accumulate = options["batch_size"] // options["micro_batch_size"]
        self.by_tokens = options.get("loss_scaling", "tokens") == "tokens"
        self.tokens = self.batches = 0
        self.strict_loading = False  # a checkpoint holds the trained parameters only (on_save_checkpoint)

    def trained(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Only what training changed: the trained parameters (a LoRA adapter's are well under 1% of
        the model; the frozen rest is rebuilt on resume by pruning again, deterministic and its scores
        cached), beside Lightning's optimizer, schedule and loop state; the counters, and the RNG
        state dropout draws from, so the resumed steps draw what the interrupted ones would have."""
        trained = self.trained()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trained}
        checkpoint["recovery"] = {"tokens": self.tokens, "batches": self.batches, "rng": torch.get_rng_state(),
                                  "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        held, trained = set(checkpoint["state_dict"]), self.trained()
        if held != trained:  # loaded non-strictly: a checkpoint of another model would load nothing, silently
            raise ValueError(f"the recovery checkpoint holds {len(held)} tensors, not the {len(trained)} this "
                             f"recovery trains (e.g. {sorted(held ^ trained)[0]!r}); delete its folder to start over")
        state = checkpoint["recovery"]
        self.tokens, self.batches = state["tokens"], state["batches"]
        torch.set_rng_state(state["rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def train(self, mode: bool = True):
        """The teacher stays in eval mode (no dropout) while Lightning puts the student in train mode."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int):
        """`train_loss`: the micro-batch's part of its step's loss as the Trainer logs it (summed over
        the step's micro-batches by tokens; their mean by micro-batches)."""
        items = batch.pop("step_items", None)
        self.tokens += int(batch["attention_mask"].sum())
        self.batches += 1
        by_tokens = self.by_tokens and items is not None
        if self.options["objective"] != "distill":
            # transformers' causal-LM loss sums the micro-batch's token losses and divides by the step's
            extra = {"num_items_in_batch": items} if by_tokens else {}
            loss = self.model(**batch, use_cache=False, **extra).loss
        else:
            out = self.model(**batch, use_cache=False)
            with torch.no_grad():
                target = self.teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      use_cache=False).logits
            scored = batch["labels"] != IGNORED
            t = self.options["temperature"]
            kl = F.kl_div(F.log_softmax(out.logits[scored].float() / t, -1), F.log_softmax(target[scored].float() / t, -1),
                          log_target=True, reduction="sum" if by_tokens else "batchmean")
            loss = (kl / items if by_tokens else kl) * t * t
        if by_tokens:
            return {"loss": loss * self.accumulate, "train_loss": loss.detach()}
        return {"loss": loss, "train_loss": loss.detach()}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss = self.model(**batch, use_cache=False).loss
        self.val_loss.update(loss, weight=int((batch["labels"][:, 1:] != IGNORED).sum()))
        self.eval_loss.update(loss, weight=len(batch["input_ids"]))
        self.log("recovery/val_loss", self.val_loss, on_step=False, on_epoch=True)
        self.log("recovery/eval_loss", self.eval_loss, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        from transformers import get_scheduler

        o = self.options
        optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=o["lr"],
                                      betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])
        steps = int(self.trainer.estimated_stepping_batches)
        horizon = o.get("schedule_steps") or steps
        if o["warmup_steps"] >= steps:  # max_steps is refused before; epochs are counted only once the data is
            log.warning("recovery: the training's %d optimizer steps end inside its recovery.warmup_steps=%d: the "
                        "learning rate never reaches recovery.lr=%g (set recovery.warmup_steps below %d)",
                        steps, o["warmup_steps"], o["lr"], steps)
        schedule = get_scheduler(o["schedule"], optimizer, num_warmup_steps=o["warmup_steps"], num_training_steps=horizon)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class StepLog(L.Callback):
    """Per optimizer step: its training loss as transformers' Trainer logs it (token-weighted over the
    step's micro-batches with loss_scaling=tokens, the mean of their means with micro_batches) and
    the learning rate it ran at; per validation during fit: the validation losses. Kept in `history`
    and logged to the active MLflow run at the step, as `recovery/train_loss`, `recovery/lr`,
    `recovery/val_loss` and `recovery/eval_loss`.

    A checkpoint holds the history so far and the MLflow run that logged it (`state_dict`). A job
    restarted after a preemption logs to a new run (the interrupted one ended KILLED), so on resume
    the history up to the checkpoint is logged again to the new run, at its steps: the run that
    FINISHED holds the whole curve. Each run names the other (`prunebench.resumed_from` on the new
    run, `prunebench.resumed_by` on the one it resumed)."""

    def __init__(self):
        self.history: list[dict[str, float]] = []
        self.losses: list[float] = []
        self.stepped, self.resumed_at, self.lr = 0, 0, 0.0

    def state_dict(self) -> dict:
        run = mlflow.active_run()
        return {"history": self.history, "run_id": run.info.run_id if run is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        run = mlflow.active_run()
        if run is None:
            return
        client, now = mlflow.MlflowClient(), int(time.time() * 1000)
        logged = [Metric(k, v, now, entry["step"]) for entry in self.history for k, v in entry.items() if k != "step"]
        for start in range(0, len(logged), BATCH):  # a long recovery's thousands of values, not a call each
            client.log_batch(run.info.run_id, metrics=logged[start:start + BATCH])
        if state["run_id"] and state["run_id"] != run.info.run_id:
            client.set_tag(run.info.run_id, "prunebench.resumed_from", state["run_id"])
            client.set_tag(state["run_id"], "prunebench.resumed_by", run.info.run_id)

    def on_train_start(self, trainer, module) -> None:
        self.stepped = self.resumed_at = trainer.global_step  # a resumed fit starts at its checkpoint's step

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["train_loss"]))
        if trainer.global_step > self.stepped:  # the optimizer just stepped
            self.stepped = trainer.global_step
            # by tokens each micro-batch's loss is already its share of the step's
            loss = sum(self.losses) / (1 if module.by_tokens else len(self.losses))
            self.record(self.stepped, {"recovery/train_loss": loss, "recovery/lr": self.lr})
            self.losses = []

    def on_validation_epoch_end(self, trainer, module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.record(trainer.global_step, {key: float(trainer.callback_metrics[key])
                                              for key in ("recovery/val_loss", "recovery/eval_loss")})

    def record(self, step: int, values: dict[str, float]) -> None:
        self.history.append({"step": step, **values})
        if mlflow.active_run() is not None:
            mlflow.log_metrics(values, step=step)


class StepProgress(L.pytorch.callbacks.TQDMProgressBar):
    """One bar over the whole training in optimizer steps, of `max_steps` (else the epochs' steps),
    instead of Lightning's bar of each epoch's micro-batches (which, with max_steps and no epochs,
    reads "Epoch 2/-2 ... 16/1"); a resumed training starts it at its checkpoint's step."""

    def on_train_start(self, trainer, module) -> None:
        from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n

        self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=int(trainer.estimated_stepping_batches))
        self.train_progress_bar.set_description("recovery steps")
        _update_n(self.train_progress_bar, trainer.global_step)

    def on_train_epoch_start(self, trainer, *_) -> None:
        pass

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n

        if self.train_progress_bar is not None and self.train_progress_bar.n != trainer.global_step:
            _update_n(self.train_progress_bar, trainer.global_step)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))

    def on_train_epoch_end(self, trainer, module) -> None:
        pass


def zero_masks(model: torch.nn.Module, names: list[str] | None) -> dict[str, torch.Tensor]:
    """{parameter name: where it is zero} for the weights recovery trains that hold zeros: the
    Linear weights of the modules named `names` (LoRA targets), or every matrix (None: full
    training). A structured model's narrowed weights hold none, so it costs nothing there."""
    masks = {}
    for module_name, module in model.named_modules():
        if names is not None and not (isinstance(module, torch.nn.Linear) and module_name.rsplit(".", 1)[-1] in names):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if param.dim() >= 2 and not bool(param.all()):
                masks[f"{module_name}.{param_name}" if module_name else param_name] = param == 0
    return masks


def ties_embeddings(model: torch.nn.Module) -> bool:
    """The model shares one tensor between its input embeddings and its LM head (the config's
    `tie_word_embeddings`, as SmolLM2 and Gemma do)."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return False
    try:
        inputs, outputs = get_in(), get_out()
    except (NotImplementedError, AttributeError):
        return False
    return inputs is not None and outputs is not None and outputs.weight is inputs.weight


def tie_again(model: torch.nn.Module) -> None:
    """The LM head shares the input embeddings' tensor again, and the config says so: peft's merge
    replaces modules and, finding the two tensors apart, sets `tie_word_embeddings=False`, so the
    export would store the head twice and a reload would hold two copies (SmolLM2: 150M parameters
    for a 122M model). Neither is a LoRA target, so the two still hold the same values."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs.weight is not inputs.weight:
        if not torch.equal(outputs.weight, inputs.weight):
            raise ValueError("the recovery changed the LM head apart from the input embeddings of a model that ties "
                             "them; leave both out of recovery.lora.targets")
        outputs.weight = inputs.weight
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(config, "tie_word_embeddings"):
            config.tie_word_embeddings = True


FUSED_ADAPTER = "experts"


def adapted(model: torch.nn.Module, options: dict) -> torch.nn.Module:
    """The model to train: wrapped with a LoRA adapter (peft), or itself with every weight trainable."""
    if options["parameters"] == "full":
        return model.requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    lora = options["lora"]

    def config(targets: list[str], dropout: float) -> LoraConfig:
        return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=dropout, target_modules=targets,
                          bias="none", task_type="CAUSAL_LM")

    targets = list(lora["targets"])
    # a target that names no module is what peft adapts as a fused parameter (an MoE's experts:
    # ParamWrapper), which refuses dropout: those get an adapter of their own, without it
    modules = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    plain, fused = [t for t in targets if t in modules], [t for t in targets if t not in modules]
    if not fused or not lora["dropout"]:
        return get_peft_model(model, config(targets, lora["dropout"]))
    if not plain:
        log.info("recovery: LoRA targets %s are fused expert parameters, trained without dropout", fused)
        return get_peft_model(model, config(fused, 0.0))
    log.info("recovery: LoRA dropout %g on %s; %s are fused expert parameters, in an adapter without dropout",
             lora["dropout"], plain, fused)
    wrapped = get_peft_model(model, config(plain, lora["dropout"]))
    wrapped.add_adapter(FUSED_ADAPTER, config(fused, 0.0))
    wrapped.base_model.set_adapter(["default", FUSED_ADAPTER])  # both trained, both merged
    return wrapped


def recover(loaded: LoadedModel, options: dict, data: RecoveryData, trainer_cfg,
            teacher: torch.nn.Module | None = None, folder: Path | None = None
            ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Trains `loaded.model` as `options` (the resolved `recovery` config) says and leaves in
    `loaded.model` the model to evaluate: adapter merged, zeros restored. `folder`: the run's
    recovery folder (keyed by its run key): a checkpoint every `checkpoint_every` optimizer steps,
    which a restarted job's recovery resumes from (Lightning's `fit(ckpt_path=...)`: the trained
    parameters, optimizer, schedule, data position and RNG; the pruned model it adds to is rebuilt
    by pruning again), and the LoRA adapter as trained (peft's `save_pretrained`, in `adapter/`,
    before the merge: an export (`export=hf`) ships it beside the merged model). Returns the summary metrics
    and the per-step history (also logged to the active MLflow run)."""
    start = time.perf_counter()
    L.seed_everything(options["seed"], verbose=False)
    train, val = data.split(data.examples(loaded.tokenizer))
    lora = options["parameters"] == "lora"
    masks = zero_masks(loaded.model, list(options["lora"]["targets"]) if lora else None)
    tied = ties_embeddings(loaded.model)
    model = adapted(loaded.model, options)
    module = RecoveryModule(model, options, teacher)
    steps = StepLog()
    accumulate = options["batch_size"] // options["micro_batch_size"]
    resume = folder / CHECKPOINT if folder is not None and (folder / CHECKPOINT).is_file() else None
    checkpoints = [L.pytorch.callbacks.ModelCheckpoint(
        (folder / CHECKPOINT).parent, filename=Path(CHECKPOINT).stem, every_n_train_steps=options["checkpoint_every"],
        save_top_k=1, enable_version_counter=False)] if folder is not None and options["checkpoint_every"] else []
    callbacks = [steps, *checkpoints]
    if trainer_cfg.get("enable_progress_bar", True):
        callbacks.append(StepProgress())
    if options["early_stopping_patience"]:
        callbacks.append(L.pytorch.callbacks.EarlyStopping("recovery/val_loss", patience=options["early_stopping_patience"]))
    trainer = instantiate(trainer_cfg, max_epochs=None if options["max_steps"] else options["epochs"],
                          max_steps=options["max_steps"] or -1, accumulate_grad_batches=accumulate,
                          gradient_clip_val=options["max_grad_norm"], val_check_interval=options["val_every"] * accumulate,
                          check_val_every_n_epoch=None, num_sanity_val_steps=0, log_every_n_steps=1,
                          callbacks=callbacks, enable_checkpointing=bool(checkpoints))
    datamodule = RecoveryDataModule(train, val, options["micro_batch_size"], options["seed"], accumulate,
                                    options["objective"])
    module.train()  # Lightning keeps the modes it is given, and a loaded model is in eval mode
    if resume is not None:
        log.info("recovery: resuming from %s", resume)
    with warnings.catch_warnings():
        # a resumed fit's false alarms: the loader does resume mid-epoch (RecoveryDataModule skips the
        # micro-batches trained on), and the checkpoint folder holds this run key's own checkpoint
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    final = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    unmerged = final["recovery/val_loss"]
    if not any(h["step"] == trainer.global_step and "recovery/val_loss" in h for h in steps.history):
        # every curve ends on a validation point: the adapter as trained, whatever val_every was
        steps.record(trainer.global_step, {key: float(final[key]) for key in ("recovery/val_loss", "recovery/eval_loss")})
    if lora and folder is not None:
        model.save_pretrained(folder / ADAPTER)
    with warnings.catch_warnings():
        if tied:  # peft's notice that the merge untied them: they are tied again below
            warnings.filterwarnings("ignore", message="Input and output embeddings are no longer tied")
        deployed = model.merge_and_unload() if lora else model
    if tied:
        tie_again(deployed)
    with torch.no_grad():
        for name, mask in masks.items():
            deployed.get_parameter(name).masked_fill_(mask, 0)
    module.model = deployed
    loss = trainer.validate(module, datamodule=datamodule, verbose=False)[0]["recovery/val_loss"]
    loaded.model = deployed.eval()
    metrics = {"recovery/steps": float(trainer.global_step), "recovery/resumed_at": float(steps.resumed_at),
               "recovery/tokens": float(module.tokens),
               "recovery/examples": float(len(train)), "recovery/loss_unmerged": float(unmerged),
               "recovery/loss_deployed": float(loss), "recovery/remask_loss_delta": float(loss - unmerged),
               "recovery/seconds": time.perf_counter() - start,
               **{key.replace("memory/", "recovery/"): value for key, value in memory.peaks().items()}}
    return metrics, steps.history
