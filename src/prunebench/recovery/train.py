"""Recovery fine-tuning in Lightning's Trainer.fit, then the model a user would deploy.

LoRA comes from peft; gradient accumulation, clipping, validation, early stopping and the progress
bar from Lightning; the learning-rate schedule from transformers (the schedules the released recipes
name). After training, the adapter is merged into the pruned weights (a structured model keeps its
narrowed shapes: a LoRA delta has the shape of the weight it is added to) and every weight that was
zero before recovery is zero again: a LoRA delta is dense, so merging it alone would undo an
unstructured or N:M pruning. What that re-masking costs is measured on the held-out examples
(`recovery/loss_unmerged` against `recovery/loss_deployed`)."""

from __future__ import annotations

import time

import lightning as L
import mlflow
import torch
import torch.nn.functional as F
import torchmetrics
from hydra.utils import instantiate
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from prunebench.bench import memory
from prunebench.models.loaded import LoadedModel
from prunebench.recovery.data import IGNORED, RecoveryData


def collate(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded micro-batch: padding has no attention and no label, so its id does not matter."""
    ids = [torch.tensor(e["input_ids"]) for e in examples]
    return {"input_ids": pad_sequence(ids, batch_first=True),
            "attention_mask": pad_sequence([torch.ones_like(i) for i in ids], batch_first=True),
            "labels": pad_sequence([torch.tensor(e["labels"]) for e in examples], batch_first=True,
                                   padding_value=IGNORED)}


class RecoveryDataModule(L.LightningDataModule):
    def __init__(self, train: list, val: list, micro_batch_size: int, seed: int):
        super().__init__()
        self.train, self.val, self.micro_batch_size, self.seed = train, val, micro_batch_size, seed

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.micro_batch_size, shuffle=True, collate_fn=collate,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.micro_batch_size, collate_fn=collate)


class RecoveryModule(L.LightningModule):
    """`objective` lm: the model's own next-token loss; distill: KL(teacher || student) on the
    temperature-softened distributions at the labelled positions, times T^2 (Hinton et al.), so its
    gradients keep their scale across temperatures. The validation loss is the next-token loss for
    both, one number to compare recoveries by (token-weighted over the held-out examples)."""

    def __init__(self, model: torch.nn.Module, options: dict, teacher: torch.nn.Module | None = None):
        super().__init__()
        self.model, self.options, self.teacher = model, options, teacher
        self.val_loss = torchmetrics.MeanMetric()
        self.tokens = 0

    def train(self, mode: bool = True):
        """The teacher stays in eval mode (no dropout) while Lightning puts the student in train mode."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int):
        self.tokens += int(batch["attention_mask"].sum())
        out = self.model(**batch, use_cache=False)
        if self.options["objective"] != "distill":
            return {"loss": out.loss, "train_loss": out.loss.detach()}
        with torch.no_grad():
            target = self.teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  use_cache=False).logits
        scored = batch["labels"] != IGNORED
        t = self.options["temperature"]
        loss = F.kl_div(F.log_softmax(out.logits[scored].float() / t, -1), F.log_softmax(target[scored].float() / t, -1),
                        log_target=True, reduction="batchmean") * t * t
        return {"loss": loss, "train_loss": loss.detach()}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss = self.model(**batch, use_cache=False).loss
        self.val_loss.update(loss, weight=int((batch["labels"][:, 1:] != IGNORED).sum()))
        self.log("recovery/val_loss", self.val_loss, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        from transformers import get_scheduler

        o = self.options
        optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=o["lr"],
                                      betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])
        schedule = get_scheduler(o["schedule"], optimizer, num_warmup_steps=o["warmup_steps"],
                                 num_training_steps=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class StepLog(L.Callback):
    """Per optimizer step: the mean training loss of its micro-batches and the learning rate it ran
    at; per validation during fit: the validation loss. Kept in `history` and logged to the active
    MLflow run at the step, as `recovery/train_loss`, `recovery/lr`, `recovery/val_loss`."""

    def __init__(self):
        self.history: list[dict[str, float]] = []
        self.losses: list[float] = []
        self.stepped, self.lr = 0, 0.0

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["train_loss"]))
        if trainer.global_step > self.stepped:  # the optimizer just stepped
            self.stepped = trainer.global_step
            self.record(self.stepped, {"recovery/train_loss": sum(self.losses) / len(self.losses), "recovery/lr": self.lr})
            self.losses = []

    def on_validation_epoch_end(self, trainer, module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.record(trainer.global_step, {"recovery/val_loss": float(trainer.callback_metrics["recovery/val_loss"])})

    def record(self, step: int, values: dict[str, float]) -> None:
        self.history.append({"step": step, **values})
        if mlflow.active_run() is not None:
            mlflow.log_metrics(values, step=step)


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


def adapted(model: torch.nn.Module, options: dict) -> torch.nn.Module:
    """The model to train: wrapped with a LoRA adapter (peft), or itself with every weight trainable."""
    if options["parameters"] == "full":
        return model.requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    lora = options["lora"]
    return get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                            target_modules=list(lora["targets"]), bias="none", task_type="CAUSAL_LM"))


def recover(loaded: LoadedModel, options: dict, data: RecoveryData, trainer_cfg,
            teacher: torch.nn.Module | None = None) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Trains `loaded.model` as `options` (the resolved `recovery` config) says and leaves in
    `loaded.model` the model to evaluate: adapter merged, zeros restored. Returns the summary
    metrics and the per-step history (also logged to the active MLflow run)."""
    start = time.perf_counter()
    L.seed_everything(options["seed"], verbose=False)
    train, val = data.split(data.examples(loaded.tokenizer))
    lora = options["parameters"] == "lora"
    masks = zero_masks(loaded.model, list(options["lora"]["targets"]) if lora else None)
    model = adapted(loaded.model, options)
    module = RecoveryModule(model, options, teacher)
    steps = StepLog()
    accumulate = options["batch_size"] // options["micro_batch_size"]
    callbacks = [steps]
    if options["early_stopping_patience"]:
        callbacks.append(L.pytorch.callbacks.EarlyStopping("recovery/val_loss", patience=options["early_stopping_patience"]))
    trainer = instantiate(trainer_cfg, max_epochs=None if options["max_steps"] else options["epochs"],
                          max_steps=options["max_steps"] or -1, accumulate_grad_batches=accumulate,
                          gradient_clip_val=options["max_grad_norm"], val_check_interval=options["val_every"] * accumulate,
                          check_val_every_n_epoch=None, num_sanity_val_steps=0, log_every_n_steps=1,
                          callbacks=callbacks)
    datamodule = RecoveryDataModule(train, val, options["micro_batch_size"], options["seed"])
    module.train()  # Lightning keeps the modes it is given, and a loaded model is in eval mode
    trainer.fit(module, datamodule=datamodule)
    unmerged = trainer.validate(module, datamodule=datamodule, verbose=False)[0]["recovery/val_loss"]
    deployed = model.merge_and_unload() if lora else model
    with torch.no_grad():
        for name, mask in masks.items():
            deployed.get_parameter(name).masked_fill_(mask, 0)
    module.model = deployed
    loss = trainer.validate(module, datamodule=datamodule, verbose=False)[0]["recovery/val_loss"]
    loaded.model = deployed.eval()
    metrics = {"recovery/steps": float(trainer.global_step), "recovery/tokens": float(module.tokens),
               "recovery/examples": float(len(train)), "recovery/loss_unmerged": float(unmerged),
               "recovery/loss_deployed": float(loss), "recovery/remask_loss_delta": float(loss - unmerged),
               "recovery/seconds": time.perf_counter() - start,
               **{key.replace("memory/", "recovery/"): value for key, value in memory.peaks().items()}}
    return metrics, steps.history
