"""A recovery beside transformers' own Trainer on the same batches (run by hand; docs/recovery.md,
"Against transformers' Trainer").

The model is pruned once as a job prunes it; a copy of the pruned model goes to each side. Ours is
`recovery.train.recover`, what a job calls. The reference is the library itself: peft's
`get_peft_model` with the recovery's LoRA config, initialised from the same seed (so the same
adapter), and `transformers.Trainer` with the recovery's optimizer, schedule, clipping,
accumulation and micro-batch, fed the training examples in the order our first epoch takes them
(a sequential sampler on the pre-ordered list) through `DataCollatorForSeq2Seq` (right padding).
LoRA dropout is 0 on both sides: the two draw their dropout masks from different RNG streams.
`--scaling micro_batches` runs the Trainer with `model_accepts_loss_kwargs=False` (its loss before
4.46). Printed and written as JSON: each step's loss on both sides, the largest difference, the
LoRA weights' largest difference, and, for ours, whether tied embeddings stayed tied and the
parameter count of the pruned model, the recovered one and its export reloaded."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="the job's Hydra overrides (model, pruner, recovery...)")
    parser.add_argument("--scaling", default="tokens", choices=["tokens", "micro_batches"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)

    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from torch.utils.data import SequentialSampler
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from prunebench.export.folder import HFFolder, write_pretrained
    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters
    from prunebench.paths import CONF_DIR
    from prunebench.pruning import prune
    from prunebench.recovery import ADAPTER
    from prunebench.recovery.data import recovery_data
    from prunebench.recovery.train import SeededSampler, recover, ties_embeddings
    from prunebench.validate import validate

    torch.set_num_threads(args.threads)
    overrides = [*args.overrides, "recovery.lora.dropout=0", "recovery.checkpoint_every=null",
                 f"recovery.loss_scaling={args.scaling}", "trainer.enable_progress_bar=false"]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides)
    validate(cfg)
    o = OmegaConf.to_container(cfg.recovery, resolve=True)
    start = time.perf_counter()
    loaded, _, _, before = prune(cfg, dense=False, writer=HFFolder())
    print(f"pruned in {time.perf_counter() - start:.0f} s", flush=True)
    pruned_params = count_parameters(loaded.model)
    nonzero = count_parameters(loaded.model, nonzero=True)
    reference = copy.deepcopy(loaded.model)
    tokenizer = loaded.tokenizer
    data = recovery_data(cfg)
    train, _ = data.split(data.examples(tokenizer))

    tied_before = ties_embeddings(loaded.model)
    work = Path(tempfile.mkdtemp(prefix="recovery-compare-"))
    start = time.perf_counter()
    _, history = recover(loaded, o, data, cfg.trainer, folder=work / "ours")
    ours_s = time.perf_counter() - start
    ours = [h["recovery/train_loss"] for h in history if "recovery/train_loss" in h]
    ours_lora = {k: v for k, v in load_file(work / "ours" / ADAPTER / "adapter_model.safetensors").items()}
    tied = ties_embeddings(loaded.model)
    write_pretrained(loaded, work / "export", {}, before)
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        reload_cfg = compose("config", ["model=hf_causal", f"model.path={work / 'export'}"])
    reloaded = get_model(reload_cfg.model).model
    print(f"ours: {ours_s:.0f} s, tied after: {tied}", flush=True)

    L.seed_everything(o["seed"], verbose=False)  # as recover() seeds before peft draws the adapter
    model = get_peft_model(reference, LoraConfig(r=o["lora"]["r"], lora_alpha=o["lora"]["alpha"], lora_dropout=0.0,
                                                 target_modules=list(o["lora"]["targets"]), bias="none",
                                                 task_type="CAUSAL_LM"))
    model.train()
    micro: list[float] = []

    class InOrder(Trainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

        def training_step(self, *a, **k):
            loss = super().training_step(*a, **k)
            micro.append(float(loss))
            return loss

    accumulate = o["batch_size"] // o["micro_batch_size"]
    order = list(SeededSampler(len(train), o["seed"]))
    training = TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=o["micro_batch_size"],
        gradient_accumulation_steps=accumulate, max_steps=o["max_steps"], learning_rate=o["lr"],
        lr_scheduler_type=o["schedule"], warmup_steps=o["warmup_steps"], weight_decay=o["weight_decay"],
        adam_beta1=o["betas"][0], adam_beta2=o["betas"][1], adam_epsilon=o["eps"], max_grad_norm=o["max_grad_norm"],
        optim="adamw_torch", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=o["seed"],
        remove_unused_columns=False, disable_tqdm=True)
    trainer = InOrder(model=model, args=training, train_dataset=[train[i] for i in order],
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100))
    if args.scaling == "micro_batches":
        trainer.model_accepts_loss_kwargs = False
    start = time.perf_counter()
    trainer.train()
    theirs_s = time.perf_counter() - start
    theirs = [sum(micro[i:i + accumulate]) for i in range(0, len(micro), accumulate)]
    theirs_lora = {k.replace(".default", ""): p.detach() for k, p in model.named_parameters() if "lora_" in k}

    lora_diff = max(float((ours_lora[k] - v).abs().max()) for k, v in theirs_lora.items())
    result = {"overrides": overrides, "scaling": args.scaling, "threads": args.threads,
              "steps": [{"step": i + 1, "ours": a, "trainer": b, "diff": a - b} for i, (a, b) in enumerate(zip(ours, theirs))],
              "max_step_loss_diff": max(abs(a - b) for a, b in zip(ours, theirs)), "max_lora_diff": lora_diff,
              "tied_before": tied_before, "tied_after": tied, "params_pruned": pruned_params,
              "params_recovered": count_parameters(loaded.model),
              "nonzero_delta": count_parameters(loaded.model, nonzero=True) - nonzero,
              "params_export_reloaded": count_parameters(reloaded), "ours_s": ours_s, "trainer_s": theirs_s}
    for row in result["steps"]:
        print(f"step {row['step']}: ours {row['ours']:.7f}  Trainer {row['trainer']:.7f}  diff {row['diff']:+.2e}")
    print({k: v for k, v in result.items() if k not in ("steps", "overrides")})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
