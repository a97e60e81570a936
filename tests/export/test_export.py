"""export=hf and prunebench-export: the pruned model as a Hugging Face folder that reloads (through
model=hf_causal, pruner=none) to the run's own predictions, at fp32, document by document."""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import TINY_MC, compose_cfg
from prunebench.job import run
from prunebench.validate import ConfigError
from helpers.export import JOB, TASK, assert_same, exported_folder, last_run, reloaded_run, round_trip



@pytest.fixture
def calib(tmp_path) -> list[str]:
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. Question: What is the capital of France? " * 30)
    return ["calib=file", f"calib.path={text}", "calib.n_samples=2", "calib.seq_len=16"]












def test_magnitude_export_is_a_logged_model_of_the_run_that_the_registry_takes(store, tmp_path):
    pruned, _, folder, pruning = round_trip("tiny-llama", ["pruner=magnitude"], tmp_path)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "pruning.json"} <= {p.name for p in folder.iterdir()}
    assert pruning["run_id"] == pruned.info.run_id
    assert pruning["run_key"] == pruned.data.tags["prunebench.run_key"]
    assert pruning["pruner"]["name"] == "magnitude" and pruning["sparsity"] == 0.5
    assert pruning["achieved"]["sparsity/actual"] == pruned.data.metrics["sparsity/actual"]
    assert pruning["params_nonzero"] == pruned.data.metrics["params/nonzero"]
    assert not pruning["padded"] and pruning["structure"]["layers_removed"] == []
    # the logged model is the run's output, and the Model Registry registers it
    uri = pruned.data.tags["prunebench.export"].removeprefix("mlflow-model:")
    model_id = uri.removeprefix("models:/")
    assert [m.model_id for m in MlflowClient().get_run(pruned.info.run_id).outputs.model_outputs] == [model_id]
    assert mlflow.get_logged_model(model_id).source_run_id == pruned.info.run_id
    version = mlflow.register_model(uri, "tiny-llama-magnitude")
    assert version.source == uri and version.status == "READY"


def test_wanda_2_4_export_keeps_the_pattern_in_dense_tensors(store, tmp_path, calib):
    import torch
    from transformers import AutoModelForCausalLM

    _, _, folder, _ = round_trip("tiny-llama", ["pruner=wanda", "pruner.pattern='2:4'", *calib], tmp_path)
    model = AutoModelForCausalLM.from_pretrained(folder)
    weight = model.model.layers[0].mlp.down_proj.weight
    assert weight.shape == (64, 128)
    assert int((weight.reshape(-1, 4) != 0).sum(1).max()) == 2 and torch.count_nonzero(weight) == weight.numel() // 2


def test_layers_bi_export_has_fewer_layers_and_fewer_parameters_by_the_block_removed(store, tmp_path, calib):
    from prunebench.models.cache import get_model
    from prunebench.models.introspection import count_parameters, transformer_blocks

    pruned, _, folder, pruning = round_trip("tiny-llama", ["pruner=layers_bi", *calib], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    assert pruning["structure"]["layers_before"] == 2 and len(pruning["structure"]["layers_removed"]) == 1
    dense = get_model(compose_cfg(["model=tiny-llama"]).model).model
    block = count_parameters(transformer_blocks(dense)[1][0])
    assert pruning["params_stored"] == count_parameters(dense) - block


def test_heads_his_export_pads_layers_with_fewer_heads_to_a_stock_shape(store, tmp_path, calib):
    _, _, folder, pruning = round_trip("tiny-llama", ["pruner=heads_his", "export.padded=true", *calib], tmp_path)
    after = pruning["structure"]["language"]["after"]
    config = json.loads((folder / "config.json").read_text())
    # global ranking leaves layers with different heads; each is stored with the most key/value heads
    # of any layer and the most query heads per key/value head, its own in the first slots, zeros after
    kv, group = max(layer["kv_heads"] for layer in after), max(layer["heads"] // layer["kv_heads"] for layer in after)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (kv * group, kv)
    assert pruning["padded"] == any((layer["heads"], layer["kv_heads"]) != (kv * group, kv) for layer in after)
    assert pruning["padded"]  # this run's ranking does leave them uneven: the case the test is for


def test_mop_export_writes_the_narrower_widths_into_the_config(store, tmp_path, calib):
    _, _, folder, pruning = round_trip("tiny-llama", ["pruner=mop", *calib], tmp_path)
    after = pruning["structure"]["language"]["after"]
    config = json.loads((folder / "config.json").read_text())
    # MoP's G steps keep the same widths in every layer: the config states them, nothing is padded
    assert not pruning["padded"] and config["intermediate_size"] == after[0]["neurons"] < 128
    assert pruning["achieved"]["mop/sequence"]


def test_tiny_mixtral_wanda_export_round_trips(store, tmp_path, calib):
    _, _, folder, _ = round_trip("tiny-mixtral", ["pruner=wanda", *calib], tmp_path, family="moe")
    assert json.loads((folder / "config.json").read_text())["num_local_experts"] == 8


def test_prunebench_export_rebuilds_a_finished_runs_model(store, tmp_path, calib, caplog):
    from prunebench.export.cli import main

    run(compose_cfg(["model=tiny-llama", *TASK, *JOB, "pruner=layers_bi", *calib]))
    pruned = last_run()
    assert "prunebench.export" not in pruned.data.tags
    # an export does not change the run key: the finished run is skipped, and the log says what to run
    with caplog.at_level("WARNING", logger="prunebench.job"):
        assert run(compose_cfg(["model=tiny-llama", *TASK, *JOB, "pruner=layers_bi", *calib, "export=hf"])) is None
    assert f"prunebench-export {pruned.info.run_id}" in caplog.text
    assert main([pruned.info.run_id, "--tracking-uri", store]) == 0
    pruned = MlflowClient().get_run(pruned.info.run_id)
    folder = exported_folder(pruned, tmp_path)
    assert json.loads((folder / "pruning.json").read_text())["run_id"] == pruned.info.run_id
    _, reloaded = reloaded_run(folder, TASK)
    assert_same(pruned, reloaded, "local_mc", ("acc", "acc_norm"))


def test_prunebench_export_refuses_a_rebuild_that_differs_from_the_run(store, tmp_path, capsys):
    from prunebench.export.cli import main

    run(compose_cfg(["model=tiny-llama", *TASK, *JOB, "pruner=magnitude"]))
    pruned = last_run()
    MlflowClient().log_metric(pruned.info.run_id, "params/nonzero", 12345.0, step=1)  # as if another model ran
    assert main([pruned.info.run_id, "--tracking-uri", store]) == 1
    assert "params/nonzero: run 12345.0" in capsys.readouterr().err
    assert "prunebench.export" not in MlflowClient().get_run(pruned.info.run_id).data.tags
    assert main(["no-such-run", "--tracking-uri", store]) == 2


def test_tiny_llava_exports_with_its_processor(store, tmp_path):
    task = ["task=easy_vqa", "trainer.enable_progress_bar=false"]
    run(compose_cfg(["model=tiny-llava", *task, *JOB, "pruner=magnitude", "export=hf"]))
    pruned = last_run()
    folder = exported_folder(pruned, tmp_path)
    assert (folder / "processor_config.json").exists() or (folder / "preprocessor_config.json").exists()
    _, reloaded = reloaded_run(folder, task, family="vlm", model="hf_vlm")
    assert_same(pruned, reloaded, "easy_vqa", ("exact_match",))


def test_export_dir_writes_a_folder_and_tags_its_path(store, tmp_path):
    pruned, _, folder, _ = round_trip("tiny-llama", ["pruner=magnitude", f"export.dir={tmp_path / 'models'}"], tmp_path)
    assert folder == tmp_path / "models" / pruned.info.run_id
    assert pruned.data.tags["prunebench.export"] == f"dir:{folder}"
    assert not pruned.outputs.model_outputs  # nothing copied into the artifact store


@pytest.mark.parametrize(("overrides", "message"), [
    (["export.dir=/tmp/x"], r"export.dir='/tmp/x' is set but export=none; choose a format .* such as export=hf"),
    (["export=hf", "export.padded=maybe"], "export.padded='maybe': use false"),
    (["export=hf", "export.dir=3"], "export.dir=3: give a folder path"),
    (["export=hf", "export._target_=builtins.dict"], "export._target_=.builtins.dict. is no export format"),
    (["model=tiny-vit", "export=hf"], "model='tiny-vit' is of family 'vision', which this format does not write"),
    (["model=tiny-mixtral", "pruner=moe_topk", "export=hf"], "export=hf: pruner='moe_topk_k1' changes how the model runs, "
                                                             "not its weights"),
])
def test_bad_export_options_fail_before_any_model_loads(overrides, message):
    from hydra.utils import get_class

    from prunebench.export.writer import export_writer

    cfg = compose_cfg(overrides)
    with pytest.raises(ConfigError, match=message):
        export_writer(cfg).check(cfg, get_class(cfg.pruner._target_))


@pytest.mark.parametrize(("argument", "new"), [
    ("export=true", "export=hf to write the model"), ("export=False", "export=hf to write the model"),
    ("export=true,false", "export=hf"), ("export_dir=/tmp/x", "export=hf export.dir=DIR"),
    ("+export_padded=true", "export=hf export.padded=true"),
])
def test_the_old_spellings_are_refused_before_hydra_naming_the_new_ones(argument, new, capsys):
    """prunebench-plan too: the same check runs before Hydra composes anything."""
    from prunebench.cli import plan_main

    assert plan_main(["model=tiny-llama", argument]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"prunebench: invalid config: {argument}: export is a config group now; write {new}"), err
    assert err.endswith("(docs/export.md)") and "\n" not in err, err


def test_the_new_spellings_pass_the_check():
    from prunebench.export.writer import moved

    assert moved(["export=hf", "export.dir=/tmp/x", "export.padded=true", "export=none", "export=hf,none"]) is None


def test_an_unwritable_export_dir_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="file is a file, not a folder; give a folder this process can write"):
        from prunebench.validate import validate

        validate(compose_cfg([*TINY_MC, "export=hf", f"export.dir={blocker / 'sub'}"]))


def test_vision_heads_a_clip_config_cannot_state_are_padded_back_to_its_count(tmp_path):
    """CLIP derives its head size from hidden_size / num_attention_heads, so a tower with fewer heads
    is stored at the config's count, the removed ones as zeros: the reloaded model computes the
    pruned one's logits exactly (a zero head adds 0.0 to every sum)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from prunebench.models.cache import get_model
    from prunebench.export.folder import mark_layers, widths, write_pretrained
    from helpers.vlm_pruning import image_inputs, pruned

    base = get_model(compose_cfg(["model=tiny-llava"]).model)
    before = widths(base.model)
    mark_layers(base.model)
    sliced, _ = pruned(base, ["pruner=heads_l2", "pruner.tower=vision"], 0.25)  # 2 of the 8 CLIP heads
    assert sum(p.numel() for p in sliced.model.parameters()) < sum(p.numel() for p in base.model.parameters())
    pruning = write_pretrained(sliced, tmp_path, {"run_id": "test"}, before)
    assert pruning["padded"] and "vision attention" in pruning["storage"][0]
    assert sum(layer["heads"] for layer in pruning["structure"]["vision"]["after"]) == 6
    again = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert again.config.vision_config.num_attention_heads == 4
    inputs = image_inputs(sliced)
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, sliced.model(**inputs).logits)


def test_bert_heads_are_padded_back_to_the_config_count(tmp_path):
    """BERT, like CLIP, cannot state fewer heads than hidden_size / head size: stored at full count."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from prunebench.models.attention import attention_heads
    from prunebench.models.cache import get_model
    from prunebench.export.folder import widths, write_pretrained
    from prunebench.pruners.heads import prune_heads

    loaded = get_model(compose_cfg(["model=tiny-bert-cls"]).model)
    before = widths(loaded.model)
    prune_heads(loaded.model, attention_heads(loaded.model), [{0}, {1, 2}])
    pruning = write_pretrained(loaded, tmp_path, {}, before)
    assert [layer["heads"] for layer in pruning["structure"]["language"]["after"]] == [3, 2] and pruning["padded"]
    ids = torch.randint(3, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, loaded.model(input_ids=ids).logits)


def test_a_per_layer_export_whose_weights_differ_from_its_structure_fails_the_load_naming_the_tensor(tmp_path):
    """The loader narrows each layer as pruning.json says, then loads strictly: a width that disagrees
    with the stored tensor, or a tensor gone, fails naming it instead of running a re-initialised layer."""
    import torch
    from safetensors.torch import load_file, save_file

    from prunebench.export.folder import mark_layers, widths, write_pretrained
    from prunebench.models.hf_causal import load_causal_lm
    from prunebench.models.introspection import count_parameters
    from prunebench.models.narrow import keep_neurons
    from prunebench.models.tiny import load_tiny

    loaded = load_tiny(**{k: v for k, v in compose_cfg(["model=tiny-llama"]).model.items() if k != "_target_"})
    mark_layers(loaded.model)
    before = widths(loaded.model)
    keep_neurons(loaded.model.model.layers[1].mlp, torch.arange(0, 128, 2))  # layer 1: 64 of 128 neurons
    pruning = write_pretrained(loaded, tmp_path, {}, before)
    assert pruning["layout"] == "per_layer" and pruning["params_stored"] == count_parameters(loaded.model)
    ids = torch.arange(1, 12)[None]
    again = load_causal_lm(path=str(tmp_path), name="again").model
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, loaded.model(input_ids=ids).logits)

    claimed = json.loads((tmp_path / "pruning.json").read_text())
    claimed["structure"]["language"]["after"][1]["neurons"] = 32
    (tmp_path / "pruning.json").write_text(json.dumps(claimed))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_causal_lm(path=str(tmp_path), name="again")

    claimed["structure"]["language"]["after"][1]["neurons"] = 64
    (tmp_path / "pruning.json").write_text(json.dumps(claimed))
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "model.layers.1.mlp.down_proj.weight"},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"Missing key.*model\.layers\.1\.mlp\.down_proj\.weight"):
        load_causal_lm(path=str(tmp_path), name="again")


def test_an_export_folder_is_replaced_whole_and_a_foreign_one_refused(tmp_path):
    """`--dir` into a folder holding someone else's files is refused before any work; an earlier export
    of the same run is replaced whole, never mixed with (an old shard index made the new one unloadable)."""
    from prunebench.export.logged_model import export_folder

    foreign = tmp_path / "models" / "run1"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"run1 is not empty and is no earlier export of run run1"):
        export_folder(str(tmp_path / "models"), "run1")
    (foreign / "pruning.json").write_text(json.dumps({"run_id": "run0"}))
    with pytest.raises(ValueError, match="no earlier export of run run1"):
        export_folder(str(tmp_path / "models"), "run1")
    (foreign / "pruning.json").write_text(json.dumps({"run_id": "run1"}))
    assert export_folder(str(tmp_path / "models"), "run1") == foreign.resolve()
    assert export_folder(str(tmp_path / "other"), "run2") == (tmp_path / "other" / "run2").resolve()


def test_exporting_again_into_the_dir_leaves_no_stale_file(store, tmp_path):
    from prunebench.export.cli import main

    pruned, _, folder, _ = round_trip("tiny-llama", ["pruner=magnitude", f"export.dir={tmp_path / 'models'}"], tmp_path)
    (folder / "model.safetensors.index.json").write_text("{}")  # an earlier layout's shard index
    assert main([pruned.info.run_id, "--dir", str(tmp_path / "models"), "--tracking-uri", store]) == 0
    assert not (folder / "model.safetensors.index.json").exists()
    assert json.loads((folder / "pruning.json").read_text())["run_id"] == pruned.info.run_id
    assert [p.name for p in (tmp_path / "models").iterdir()] == [pruned.info.run_id]  # no partial folder left
