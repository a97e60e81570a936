"""Recovery fine-tuning's speed and memory against LLM-Pruner's released loop, side by side in one
run: tokens per second and peak host memory of prunebench's recovery (`recovery.train.recover`, what
a job calls: Lightning's Trainer.fit with a peft LoRA adapter) and of horseee/LLM-Pruner's
`post_training.py` loop (transformers' Trainer with peft, configured as that script configures it),
on one pruned model, the same tokenized examples, batch, micro-batch, sequence length, optimizer
steps, dtype and thread count.

    .venv/bin/python scripts/recovery_speed.py                      # SmolLM2-135M, LLM-Pruner 20%, fp32 CPU
    .venv/bin/python scripts/recovery_speed.py --quick              # tiny-llama: checks the script in seconds
    .venv/bin/python scripts/recovery_speed.py --steps 12 --repeats 3 recovery.batch_size=8 ...

Arguments other than the --options are prunebench config overrides (model, pruner, sparsity, calib,
recovery.*). The model is pruned once here and saved whole with its tokenizer (as post_training.py
reads `--prune_model`: `torch.load` of {model, tokenizer}); each side then runs in a fresh
subprocess that loads it, so a side's peak memory is its own, and the sides alternate
(ours, ref, ours, ref, ...), medians reported, so a drift in the machine's load hits both alike.

Both sides are measured by the same instruments, installed in the child before it trains: torch's
global optimizer-step hook stamps the time of every optimizer step, and a forward pre-hook on the
pruned model counts the attention mask's ones (the non-padding tokens) of every training forward.
Tokens per second is the tokens fed after the `--warmup` steps over the time from the end of the
last warm-up step to the end of the last step. Memory: the process's peak resident set (Linux's
VmHWM: the larger of its peak while loading and its peak after), and what each side's own work
added above the resident set it started from (libraries imported and the pruned model loaded; the
high-water mark is reset there): the adapter, its data (ours tokenizes the text inside `recover`,
the reference reads the same examples from a file), the trainer and the training.

The reference, step by step from post_training.py (commit 38452d5): LoraConfig(r, lora_alpha,
target_modules, lora_dropout, bias="none", task_type="CAUSAL_LM") and get_peft_model;
`prepare_model_for_int8_training` on a model not loaded in 8 bits only freezes the weights (peft
does too) and casts the LM head's output to fp32 (nothing at fp32), so it is left out; the pad id 0
and left padding; DataCollatorForSeq2Seq(pad_to_multiple_of=8, padding=True); TrainingArguments with
per_device_train_batch_size = micro-batch, gradient_accumulation_steps = batch / micro-batch,
warmup_steps, learning_rate, optim="adamw_torch", the Trainer's default max_grad_norm 1.0, and
max_steps for num_train_epochs; no fp16 (a CPU), no evaluation or checkpoint during the timed steps,
no wandb. Ours runs with the same values (`recovery.max_grad_norm=1.0` for the Trainer's clipping)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
VALID = DATA / "wikitext2" / "wiki.valid.raw"
DEFAULTS = ["model=smollm2-135m", "pruner=llm_pruner", "sparsity=0.2", "task=wikitext2_ppl", f"data_dir={DATA}",
            "calib=file", f"calib.path={VALID}", "calib.n_samples=32", "calib.seq_len=256",
            "recovery=lora", "recovery.data=file", f"recovery.path={VALID}", "recovery.seq_len=128",
            "recovery.batch_size=16", "recovery.micro_batch_size=4", "recovery.val_samples=16",
            "recovery.max_grad_norm=1.0", "trainer.enable_progress_bar=false", "tracking.ensure_dense=false"]
QUICK = ["model=tiny-llama", "recovery.seq_len=64"]


def status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes (Linux's /proc)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class Meter:
    """Optimizer-step times and training tokens, by hooks that see both loops alike."""

    def __init__(self, model):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.times: list[float] = []
        self.tokens_at: list[int] = []
        self.tokens = 0
        register_optimizer_step_post_hook(self.stepped)
        # on the decoder: peft calls the causal LM's `forward` itself, past its hooks
        model.get_decoder().register_forward_pre_hook(self.fed, with_kwargs=True)

    def fed(self, module, args, kwargs) -> None:
        if module.training:  # a validation forward is not training throughput
            self.tokens += int(kwargs["attention_mask"].sum())

    def stepped(self, optimizer, args, kwargs) -> None:
        self.times.append(time.perf_counter())
        self.tokens_at.append(self.tokens)

    def start(self) -> None:
        from prunebench.bench import memory

        self.before = status()
        memory.reset_peaks()  # VmHWM from here: training's peak, the loaded model included
        self.rss_start = status()["VmRSS"]

    def result(self, warmup: int) -> dict:
        peak = status()["VmHWM"]
        if len(self.times) <= warmup:
            raise SystemExit(f"{len(self.times)} optimizer steps ran: need more than --warmup {warmup}")
        seconds = self.times[-1] - self.times[warmup - 1]
        tokens = self.tokens_at[-1] - self.tokens_at[warmup - 1]
        return {"steps": len(self.times), "timed_steps": len(self.times) - warmup, "timed_tokens": tokens,
                "timed_s": seconds, "tokens_per_s": tokens / seconds,
                "peak_gb": max(peak, self.before["VmHWM"]) / 1e9, "training_peak_gb": peak / 1e9,
                "added_gb": (peak - self.rss_start) / 1e9, "load_peak_gb": self.before["VmHWM"] / 1e9}


def run_ours(state: dict, loaded, meter: Meter, folder: Path) -> None:
    """What job.recover_model calls for a LoRA recovery, on the saved pruned model."""
    from omegaconf import OmegaConf

    from prunebench.recovery.data import RecoveryData
    from prunebench.recovery.train import recover

    cfg = OmegaConf.create(state["cfg"])
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    recover(loaded, options, RecoveryData(options, cfg.get("data_dir")), cfg.trainer, None, folder)


def run_reference(state: dict, loaded, meter: Meter, folder: Path) -> None:
    """post_training.py's loop (see the module's docstring), on the examples ours trains on (read
    here, after the memory's reset, as ours tokenizes its own inside `recover`)."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    options = state["options"]
    examples = torch.load(state["examples"], weights_only=False)
    tokenizer = loaded.tokenizer
    tokenizer.pad_token_id = 0
    tokenizer.padding_side = "left"
    lora = options["lora"]
    model = get_peft_model(loaded.model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"],
                                                    target_modules=list(lora["targets"]), lora_dropout=lora["dropout"],
                                                    bias="none", task_type="CAUSAL_LM"))
    train = [{**e, "attention_mask": [1] * len(e["input_ids"])} for e in examples]  # as its tokenize() returns
    trainer = transformers.Trainer(
        model=model, train_dataset=train,
        args=transformers.TrainingArguments(
            per_device_train_batch_size=options["micro_batch_size"],
            gradient_accumulation_steps=options["batch_size"] // options["micro_batch_size"],
            warmup_steps=options["warmup_steps"], max_steps=options["max_steps"], learning_rate=options["lr"],
            fp16=False, logging_steps=10, logging_first_step=True, optim="adamw_torch", eval_strategy="no",
            save_strategy="no", output_dir=str(folder), report_to="none", seed=options["seed"],
            disable_tqdm=True),
        data_collator=transformers.DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=8, return_tensors="pt",
                                                          padding=True))
    model.config.use_cache = False
    trainer.train()


def child(side: str, state_path: Path, warmup: int, threads: int) -> None:
    """One side in this fresh process: its libraries, the saved pruned model, its loop; one JSON line."""
    import torch

    torch.set_num_threads(threads)
    if side == "ours":
        import prunebench.recovery.train  # noqa: F401  (Lightning, peft: before the model, as in a job)
    else:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    from prunebench.models.loaded import LoadedModel

    state = torch.load(state_path, weights_only=False)
    loaded = LoadedModel(state["model"], state["tokenizer"], state["name"], "causal_lm", state["max_length"])
    meter = Meter(loaded.model)
    meter.start()  # each side's own work from here: adapter, data, trainer, training
    with tempfile.TemporaryDirectory() as folder:
        (run_ours if side == "ours" else run_reference)(state, loaded, meter, Path(folder))
    print("RESULT " + json.dumps(meter.result(warmup)), flush=True)


def prepare(overrides: list[str], steps: int, path: Path) -> dict:
    """Prunes the model as a job would (score cache included) and saves it, its tokenizer and the
    config for both sides to load, and beside it the training examples ours draws
    (`RecoveryData.split`) for the reference."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from prunebench.pruning import prune
    from prunebench.startup import load_libraries
    from prunebench.paths import CONF_DIR
    from prunebench.recovery.data import recovery_data
    from prunebench.validate import validate

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"recovery.max_steps={steps}",
                                           f"recovery.val_every={steps + 1}", "recovery.checkpoint_every=null"])
    validate(cfg)
    load_libraries()
    loaded, _, stats, _ = prune(cfg, dense=False)
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    data = recovery_data(cfg)
    train, _ = data.split(data.examples(loaded.tokenizer))
    examples = path.with_suffix(".examples.pt")
    torch.save(train, examples)
    torch.save({"model": loaded.model, "tokenizer": loaded.tokenizer, "name": loaded.name,
                "max_length": loaded.max_length, "cfg": OmegaConf.to_container(cfg, resolve=True),
                "options": options, "examples": str(examples)}, path)
    params = sum(p.numel() for p in loaded.model.parameters())
    return {"model": cfg.model.name, "pruner": cfg.pruner.name, "sparsity": cfg.sparsity,
            "sparsity_actual": stats.get("sparsity/actual"), "params": params,
            "dtype": str(next(loaded.model.parameters()).dtype), "train_examples": len(train),
            "seq_len": options["seq_len"], "batch_size": options["batch_size"],
            "micro_batch_size": options["micro_batch_size"], "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="prunebench config overrides (model=..., recovery.*=...)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="optimizer steps left out of the timing")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads of both sides")
    parser.add_argument("--quick", action="store_true", help="tiny-llama, 64-token examples: the script in seconds")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    parser.add_argument("--side", choices=("ours", "ref"), help=argparse.SUPPRESS)  # a child's own run
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child(args.side, args.state, args.warmup, args.threads)
        return
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be at least 1 (the first step's start is not stamped) and below --steps")
    overrides = [*DEFAULTS, *(QUICK if args.quick else []), *args.overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    rows: dict[str, list[dict]] = {"ours": [], "ref": []}
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "pruned.pt"
        setup = prepare(overrides, args.steps, state)
        print(f"{setup['model']} {setup['pruner']} {setup['sparsity']} ({setup['params'] / 1e6:.1f} M parameters, "
              f"{setup['dtype']}), {setup['train_examples']} examples of {setup['seq_len']} tokens, batch "
              f"{setup['batch_size']} in micro-batches of {setup['micro_batch_size']}, {args.steps} steps "
              f"({args.warmup} warm-up), {args.threads} threads", flush=True)
        for repeat in range(args.repeats):
            for side in ("ours", "ref"):
                start = time.perf_counter()
                done = subprocess.run([sys.executable, __file__, "--side", side, "--state", str(state),
                                       "--warmup", str(args.warmup), "--threads", str(args.threads)],
                                      env=env, capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode or not lines:
                    sys.exit(f"{side} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
                row = {**json.loads(lines[-1][len("RESULT "):]), "process_s": time.perf_counter() - start,
                       "load_average": os.getloadavg()[0]}
                rows[side].append(row)
                print(f"  {repeat + 1} {side:<4} {row['tokens_per_s']:8.1f} tokens/s ({row['timed_tokens']} tokens "
                      f"in {row['timed_s']:.1f} s)  peak {row['peak_gb']:.3f} GB (its own work "
                      f"+{row['added_gb']:.3f})  process {row['process_s']:.0f} s  load {row['load_average']:.2f}", flush=True)
    medians = {side: {key: statistics.median(r[key] for r in runs) for key in ("tokens_per_s", "peak_gb", "added_gb")}
               for side, runs in rows.items()}
    print(f"\n{'median':<8}{'tokens/s':>10}{'peak GB':>10}{'+own work GB':>14}")
    for side, label in (("ours", "ours"), ("ref", "HF ref")):
        m = medians[side]
        print(f"{label:<8}{m['tokens_per_s']:>10.1f}{m['peak_gb']:>10.3f}{m['added_gb']:>14.3f}")
    ours, ref = medians["ours"], medians["ref"]
    print(f"ours / HF Trainer: throughput {ours['tokens_per_s'] / ref['tokens_per_s']:.3f}x, peak memory "
          f"{ours['peak_gb'] / ref['peak_gb']:.3f}x, memory its own work added "
          f"{ours['added_gb'] / ref['added_gb']:.3f}x")
    if args.out:
        args.out.write_text(json.dumps({"setup": {**setup, "warmup": args.warmup, "threads": args.threads,
                                                  "overrides": overrides}, "runs": rows, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
