"""Recovery against transformers' own Trainer with peft's LoRA (the library run, not a transcription
of it): the same pruned tiny Llama, the same training examples in the same order, the same adapter
initialisation, dropout 0, a few optimizer steps of accumulated micro-batches whose labelled tokens
differ. Per-step losses and the trained LoRA weights agree in both loss scalings (docs/recovery.md,
"Gradient accumulation")."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY_MC, compose_cfg
from prunebench.pruning import prune
from prunebench.recovery.data import recovery_data
from prunebench.recovery.train import recover
from prunebench.validate import validate

STEPS = 3


@pytest.fixture
def records(tmp_path):
    """Instruction records whose responses run from a word to a paragraph, so the micro-batches of a
    step hold very different numbers of labelled tokens (where the two scalings part)."""
    words = "the pruned model answers questions about the weather in short sentences".split()
    rows = [{"instruction": f"Describe item {i}.", "input": "" if i % 3 else f"context {i}",
             "output": " ".join(words[j % len(words)] for j in range(1 + (i * 7) % 30))} for i in range(24)]
    path = tmp_path / "records.json"
    path.write_text(json.dumps(rows))
    return path


def overrides(path, scaling: str) -> list[str]:
    return ["pruner=magnitude", "sparsity=0.3", "recovery=lora", "recovery.data=file", f"recovery.path={path}",
            "recovery.seq_len=256", "recovery.batch_size=4", "recovery.micro_batch_size=2", "recovery.val_samples=4",
            "recovery.warmup_steps=1", "recovery.lr=5e-3", "recovery.lora.dropout=0", f"recovery.max_steps={STEPS}",
            "recovery.checkpoint_every=null", f"recovery.loss_scaling={scaling}"]


def adapter_weights(model) -> dict[str, torch.Tensor]:
    return {name.replace(".default", ""): p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def trainer_run(cfg, train: list, out) -> tuple[list[float], dict[str, torch.Tensor]]:
    """transformers' Trainer on the examples in the order given, with peft's adapter initialised
    from the recovery's seed as ours is; (its per-step losses, its LoRA weights)."""
    import lightning as L
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import SequentialSampler
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    o = OmegaConf.to_container(cfg.recovery, resolve=True)
    loaded = prune(cfg, dense=False)[0]
    L.seed_everything(o["seed"], verbose=False)  # recover() seeds so before peft draws the adapter
    model = get_peft_model(loaded.model, LoraConfig(r=o["lora"]["r"], lora_alpha=o["lora"]["alpha"], lora_dropout=0.0,
                                                    target_modules=list(o["lora"]["targets"]), bias="none",
                                                    task_type="CAUSAL_LM"))
    model.train()
    micro_losses: list[float] = []

    class InOrder(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            micro_losses.append(float(loss))  # what the Trainer adds to its logged loss
            return loss

    accumulate = o["batch_size"] // o["micro_batch_size"]
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=o["micro_batch_size"],
                             gradient_accumulation_steps=accumulate, max_steps=o["max_steps"],
                             learning_rate=o["lr"], lr_scheduler_type=o["schedule"], warmup_steps=o["warmup_steps"],
                             weight_decay=o["weight_decay"], adam_beta1=o["betas"][0], adam_beta2=o["betas"][1],
                             adam_epsilon=o["eps"], max_grad_norm=o["max_grad_norm"], optim="adamw_torch",
                             logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=o["seed"],
                             remove_unused_columns=False, disable_tqdm=True, dataloader_num_workers=0)
    trainer = InOrder(model=model, args=args, train_dataset=train,
                      data_collator=DataCollatorForSeq2Seq(loaded.tokenizer, padding=True, label_pad_token_id=-100))
    if o["loss_scaling"] == "micro_batches":
        trainer.model_accepts_loss_kwargs = False  # the Trainer before 4.46: each micro-batch's mean / accumulation
    else:
        assert trainer.model_accepts_loss_kwargs  # the model divides by num_items_in_batch
    trainer.train()
    steps = [sum(micro_losses[i:i + accumulate]) for i in range(0, len(micro_losses), accumulate)]
    return steps, adapter_weights(model)


@pytest.mark.parametrize("scaling", ["tokens", "micro_batches"])
def test_recovery_steps_as_the_transformers_trainer_does(records, tmp_path, scaling, one_thread):
    from safetensors.torch import load_file

    from prunebench.recovery import ADAPTER
    from prunebench.recovery.train import SeededSampler

    cfg = compose_cfg(TINY_MC + overrides(records, scaling))
    validate(cfg)
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    loaded = prune(cfg, dense=False)[0]
    data = recovery_data(cfg)
    train, _ = data.split(data.examples(loaded.tokenizer))
    metrics, history = recover(loaded, options, data, cfg.trainer, folder=tmp_path / "ours")
    ours = [h["recovery/train_loss"] for h in history if "recovery/train_loss" in h]
    ours_lora = {k.replace("base_model.model.", ""): v
                 for k, v in load_file(tmp_path / "ours" / ADAPTER / "adapter_model.safetensors").items()}

    order = list(SeededSampler(len(train), options["seed"]))  # the first epoch's order, handed to the Trainer
    theirs, theirs_lora = trainer_run(cfg, [train[i] for i in order], tmp_path / "hf")
    assert len(ours) == len(theirs) == STEPS == metrics["recovery/steps"]
    # fp32 (the tiny model's dtype) on one thread, the same kernels on the same shapes: the two agree to the
    # bit here; the bounds allow what may differ, where the step's losses are summed (Python floats here, an
    # fp32 tensor there) and our loss x accumulation that Lightning divides again, a few ulp of fp32
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-6)
    theirs_lora = {k.replace("base_model.model.", ""): v for k, v in theirs_lora.items()}
    assert set(ours_lora) == set(theirs_lora) and ours_lora
    for name, weight in theirs_lora.items():
        torch.testing.assert_close(ours_lora[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_the_two_scalings_part_where_micro_batches_hold_different_tokens(records, one_thread):
    deltas = {}
    for scaling in ("tokens", "micro_batches"):
        cfg = compose_cfg(TINY_MC + overrides(records, scaling))
        loaded = prune(cfg, dense=False)[0]
        before = {name: p.detach().clone() for name, p in loaded.model.named_parameters()}
        recover(loaded, OmegaConf.to_container(cfg.recovery, resolve=True), recovery_data(cfg), cfg.trainer)
        deltas[scaling] = torch.cat([(p.detach() - before[name]).flatten()
                                     for name, p in loaded.model.named_parameters()])
    # the same batches, weighted otherwise: the merged updates 3.4% apart (relative L2; Adam's first steps
    # follow the gradients' signs, which the weighting moves in few coordinates), rounding would be ~1e-6
    apart = (deltas["tokens"] - deltas["micro_batches"]).norm() / deltas["tokens"].norm()
    assert apart > 1e-2
