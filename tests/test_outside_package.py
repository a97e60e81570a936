"""A lab's own pruner, task, experiment, recovery data kind and export format, kept in its own
package (examples/mylab) and found through Hydra's search path (docs/architecture.md): installed,
they sweep like built-ins with their scores cached across ratios, validation reads what the class
declares, the score cache tells packages apart, `prunebench-plan` expands the package's
experiment, its chat conversations recover a pruned model through the job, and a job writes its
model in the package's format."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from hydra.utils import instantiate
from hydra.utils import get_class
from omegaconf import OmegaConf, open_dict

from conftest import TINY_MC, compose_cfg
from helpers.recovery import ONE_STEP
from prunebench import job
from prunebench.cache import content_key
from prunebench.pruning import score_identity
from prunebench.paths import CONF_DIR
from prunebench.cli import plan_main
from prunebench.pruners.score_cache import cached_scores
from prunebench.recovery.data import IGNORED
from prunebench.validate import ConfigError, validate
from prunebench.calibration import calibration_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mylab"
SEARCHPATH = "hydra.searchpath=[pkg://mylab.conf]"
QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


@pytest.fixture
def mylab(monkeypatch):
    """The example package importable in this process, as `pip install -e examples/mylab` makes it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


@pytest.fixture
def calib_text(tmp_path) -> Path:
    """Calibration text for `calib=file`: any text will do for a random tiny model."""
    path = tmp_path / "calib.txt"
    path.write_text("the quick brown fox jumps over the lazy dog and keeps on running . " * 40)
    return path


def calibrated(calib_text: Path) -> list[str]:
    return ["calib=file", f"calib.path={calib_text}", "calib.n_samples=4", "calib.seq_len=32"]


def test_the_installed_package_sweeps_its_pruner_on_its_task_scoring_once(tmp_path, calib_text):
    """pip-installed (not editable, so its configs and questions must travel as package data), the
    experiment's sweep of mylab's RIA over two ratios runs on mylab's task; the second ratio reads
    the first one's scores from the cache."""
    source = tmp_path / "mylab-source"  # a copy: setuptools leaves build/ in the tree it builds
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    assert (target / "mylab" / "conf" / "pruner" / "ria.yaml").is_file()
    assert (target / "mylab" / "conf" / "export" / "bitmask.yaml").is_file()
    assert (target / "mylab" / "data" / "units.jsonl").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PRUNEBENCH_CACHE": str(tmp_path / "cache")}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # the preset's pruner axis narrowed to mylab's pruner on the command line (the command line wins)
    proc = subprocess.run([sys.executable, "-m", "prunebench", "-m", SEARCHPATH, "experiment=ria_vs_wanda",
                           "model=tiny-llama", "pruner=ria", *calibrated(calib_text), f"tracking.uri={uri}", *QUIET],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("prunebench").experiment_id], order_by=["attributes.start_time ASC"])
    jobs = [r for r in runs if r.data.tags.get("prunebench.pruner") == "ria"]
    assert [r.data.tags["prunebench.sparsity"] for r in jobs] == ["0.3", "0.5"]
    assert [r.data.tags["prunebench.score_cache"] for r in jobs] == ["miss", "hit"]
    for run in jobs:
        assert run.info.status == "FINISHED" and run.data.tags["prunebench.task"] == "units_mc"
        assert run.data.metrics["units_mc/n_docs"] == 8  # the eight questions shipped in mylab/data
        assert 0 <= run.data.metrics["units_mc/acc_norm"] <= 1
        # scope=row removes floor(n * sparsity) of each row's n inputs; tiny-llama's rows have 64 or 128
        assert run.data.metrics["sparsity/actual"] == int(64 * float(run.data.tags["prunebench.sparsity"])) / 64
    assert len(list((tmp_path / "cache" / "scores").glob("*.safetensors"))) == 1


def test_the_plan_expands_the_packages_experiment_against_wanda_and_sparsegpt(mylab, calib_text, capsys, store):
    assert plan_main([SEARCHPATH, "experiment=ria_vs_wanda", "model=tiny-llama", *calibrated(calib_text)]) == 0
    out = capsys.readouterr().out
    assert "6 grid jobs + 1 dense baseline(s): 0 done, 7 left, 0 invalid" in out
    rows = {line.split("  ")[-1].strip(): line for line in out.splitlines()[3:9]}
    assert set(rows) == {f"pruner={p} sparsity={s}" for p in ("ria", "wanda", "sparsegpt") for s in (0.3, 0.5)}
    assert "eval (scores shared)" in rows["pruner=ria sparsity=0.5"]  # the plan knows mylab's scores are cached
    # and that sequential Wanda (the default) prunes through the pruned blocks in every job, caching nothing
    assert "iterative+eval" in rows["pruner=wanda sparsity=0.5"] and "iterative+eval" in rows["pruner=wanda sparsity=0.3"]


@pytest.mark.parametrize("overrides, message", [
    (["model=tiny-mixtral"], r"pruner='ria' cannot apply to model='tiny-mixtral' \(family 'moe'\); "
                             r"it supports: \['causal_lm', 'vlm'\]"),
    (["calib=none"], "pruner='ria' needs calibration data, but calib='none'"),
    (["model=tiny-llava", "task=easy_vqa", "pruner.tower=vision"], r"cannot prune the vision tower .* it prunes: \['language'\]"),
    (["pruner.pattern='2:4'", "sparsity=0.3"], "pruner='ria' is misconfigured: pruner.pattern='2:4' removes exactly 0.5"),
    (["pruner.alpha=-1"], r"(?s)pruner='ria' is misconfigured: .*pruner.alpha=-1 must be >= 0"),
])
def test_validation_reads_what_the_outside_class_declares(mylab, calib_text, overrides, message):
    calib = [] if "calib=none" in overrides else calibrated(calib_text)
    cfg = compose_cfg([SEARCHPATH, "model=tiny-llama", "pruner=ria", "task=units_mc", *calib, *overrides])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_the_score_cache_keys_on_the_class_not_on_the_config_name(mylab, tmp_path, monkeypatch, calib_text):
    """Two labs' `ria` (one config, same class name, other modules) never share scores; one class
    named through a re-export shares its own."""
    for lab, body in (("otherlab", "from mylab.pruners import RelativeImportancePruner as Base\n\n\n"
                                   "class RelativeImportancePruner(Base):\n    pass\n"),
                      ("aliaslab", "from mylab.pruners import RelativeImportancePruner\n")):
        (tmp_path / lab).mkdir()
        (tmp_path / lab / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    cfg = compose_cfg([SEARCHPATH, "model=tiny-llama", "pruner=ria", "task=units_mc", *calibrated(calib_text)])

    def key(target: str) -> str:
        other = copy.deepcopy(cfg)
        with open_dict(other):
            other.pruner._target_ = target
        return content_key(score_identity(other, True))

    mine, theirs, alias = key("mylab.pruners.RelativeImportancePruner"), key("otherlab.RelativeImportancePruner"), \
        key("aliaslab.RelativeImportancePruner")
    assert mine != theirs and mine == alias

    class Counting:
        """A stand-in scorer: counts the scorings the cache lets through."""
        cacheable, calls = True, 0

        def score(self, loaded, calib):
            Counting.calls += 1
            return {"w": torch.ones(2)}

    for target, expect_hit in (("mylab.pruners.RelativeImportancePruner", False),
                               ("otherlab.RelativeImportancePruner", False), ("aliaslab.RelativeImportancePruner", True)):
        other = copy.deepcopy(cfg)
        with open_dict(other):
            other.pruner._target_ = target
        _, hit = cached_scores(Counting(), None, None, score_identity(other, True))
        assert hit is expect_hit, target
    assert Counting.calls == 2


def test_built_in_pruners_keep_the_score_keys_they_had():
    """score_identity writes the class's module.qualname in place of `_target_`: for every built-in
    pruner that is the `_target_` itself, so the score caches teams have filled stay valid. Only the
    options a class names `unscored` (OWL's base and lambda, REAP's score: how scores are applied, not
    the scores) are left out, and no pruner that was there before names any."""
    for path in sorted((Path(CONF_DIR) / "pruner").glob("*.yaml")):
        cfg = compose_cfg(["model=tiny-llama", f"pruner={path.stem}"])
        unscored = get_class(cfg.pruner._target_).unscored
        expected = {k: v for k, v in OmegaConf.to_container(cfg.pruner, resolve=True).items() if k not in unscored}
        assert score_identity(cfg, False)["pruner"] == expected, path.stem
        assert not unscored or path.stem.startswith(("owl", "reap")), path.stem


def test_ria_importance_is_relative_share_times_activation_norm(mylab):
    from mylab.pruners import RelativeImportancePruner

    matrix = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        matrix.weight.copy_(torch.tensor([[1.0, -2.0], [3.0, 4.0]]))
    norms = torch.tensor([2.0, 3.0])  # ||X_j||, from the cached sums of squares 4 and 9
    got = RelativeImportancePruner(alpha=0.5).importance({"m": matrix}, {"m": norms ** 2})["m"]
    # row sums 3, 7; column sums 4, 6
    want = torch.tensor([[1 / 3 + 1 / 4, 2 / 3 + 2 / 6], [3 / 7 + 3 / 4, 4 / 7 + 4 / 6]]) * norms.sqrt()[None, :]
    torch.testing.assert_close(got, want)


def test_ria_prunes_the_language_tower_of_a_vision_language_model(mylab, calib_text):
    """`families` declares vlm: a text calibration serves it, and only language-model matrices change."""
    from prunebench.models.cache import get_model

    cfg = compose_cfg([SEARCHPATH, "model=tiny-llava", "task=easy_vqa", "pruner=ria", *calibrated(calib_text)])
    validate(cfg)
    loaded = copy.deepcopy(get_model(cfg.model))
    before = {n: p.clone() for n, p in loaded.model.named_parameters()}
    pruner = instantiate(cfg.pruner, _convert_="all")
    stats = pruner.apply(loaded, pruner.score(loaded, instantiate(calibration_config(cfg), _convert_="all")), 0.5)
    assert stats["sparsity/actual"] == pytest.approx(0.5)
    changed = {n for n, p in loaded.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("language_model" in n for n in changed), sorted(changed)[:5]


def test_a_model_config_in_a_folder_builds_on_a_built_in_one(tmp_path):
    """docs/architecture.md's model example, read from a file:// folder: its defaults list finds
    prunebench's hf_causal across the search path."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mylab-llama-ft.yaml").write_text(
        "defaults:\n  - hf_causal\n  - _self_\nname: mylab-llama-ft\npath: /models/mylab-llama-ft\n"
        "dtype: bfloat16\nparams_b: 6.7\n")
    model = compose_cfg([f"hydra.searchpath=[file://{tmp_path}]", "model=mylab-llama-ft"]).model
    built_in = compose_cfg(["model=hf_causal", "model.path=x"]).model
    assert model._target_ == built_in._target_ and model.family == "causal_lm"
    assert (model.name, model.path, model.dtype, model.trust_remote_code) == \
        ("mylab-llama-ft", "/models/mylab-llama-ft", "bfloat16", False)


# ChatML (Qwen's, SmolLM2-Instruct's), for the tiny model's tokenizer, which carries no chat template
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def conversation(number: int) -> dict:
    return {"messages": [{"role": "system", "content": "Answer in one line."},
                         {"role": "user", "content": f"How many metres are {number} kilometres?"},
                         {"role": "assistant", "content": f"{number * 1000} metres."},
                         {"role": "user", "content": "And in centimetres?"},
                         {"role": "assistant", "content": f"{number * 100_000} centimetres."}]}


@pytest.fixture
def chats(tmp_path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(conversation(n)) + "\n" for n in range(1, 7)))
    return path


def chat_cfg(chats: Path, *overrides: str):
    """mylab's chat recovery (its one YAML, conf/recovery/chat.yaml) on a pruned tiny-llama, in ChatML."""
    cfg = compose_cfg([SEARCHPATH, *TINY_MC, "pruner=magnitude", "sparsity=0.5", "limit=2", "tracking.ensure_dense=false",
                       "recovery=chat", f"recovery.path={chats}", *ONE_STEP, *overrides])
    OmegaConf.update(cfg, "recovery.data.chat_template", CHATML)
    return cfg


def test_a_packages_recovery_data_kind_trains_a_step_through_the_job(mylab, chats, store, one_thread):
    """mylab/chat_data.py and conf/recovery/chat.yaml, nothing in prunebench: validated, trained,
    recorded with its file's digest, and keyed by its class."""
    metrics = job.run(chat_cfg(chats, "recovery.seq_len=128"))  # the tiny tokenizer spells ChatML's markers out
    assert metrics["recovery/steps"] == 1
    assert metrics["recovery/examples"] == 6 - 2  # six conversations, two held out
    assert metrics["recovery/nonzero_delta"] == 0  # the pruning's zeros kept through training
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("prunebench").experiment_id],
                                "tags.`prunebench.recovery` = 'chat'")
    assert run.data.tags["prunebench.recovery_data"].startswith("chats.jsonl@")
    assert run.data.params["recovery.data._target_"] == "mylab.chat_data.ChatData"


def test_the_chat_kind_learns_the_assistants_turns_only(mylab, chats):
    from prunebench.models.tiny import tiny_tokenizer
    from prunebench.recovery.data import recovery_data

    tokenizer = tiny_tokenizer()
    (example, *_) = recovery_data(chat_cfg(chats, "recovery.seq_len=256")).examples(tokenizer)
    learned = [token for token, label in zip(example["input_ids"], example["labels"]) if label != IGNORED]
    assert tokenizer.decode(learned) == "1000 metres.<|im_end|>\n100000 centimetres.<|im_end|>\n"
    assert tokenizer.decode(example["input_ids"]).startswith("<|im_start|>system\nAnswer in one line.<|im_end|>")
    (whole, *_) = recovery_data(chat_cfg(chats, "recovery.seq_len=256", "recovery.train_on_inputs=true")).examples(tokenizer)
    assert whole["labels"] == whole["input_ids"] == example["input_ids"]


@pytest.mark.parametrize("records, overrides, message", [
    ([{"text": "hello"}], [], r"record 1 is not \{\"messages\": .* with roles \['system', 'user', 'assistant'\]"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], [], "record 1 has no assistant turn"),
    ([conversation(1)] * 3, [], r"has 3 conversations: fewer than one batch \(recovery.batch_size=2\) besides the "
                                r"recovery.val_samples=2 held out"),
    ([conversation(1)] * 6, ["+recovery.data.system_prompt=x"], r"recovery.data=\{.*\}: .*unexpected keyword argument "
                                                                 r"'system_prompt'"),
    ([conversation(1)] * 6, ["recovery.data._target_=mylab.chat_data.Chat"],
     r"recovery.data._target_='mylab.chat_data.Chat' cannot be imported \(AttributeError"),
    ([conversation(1)] * 6, ["recovery.data._target_=mylab.sources.PackagedJson"],
     "is not a prunebench.recovery.data.RecoveryData subclass"),
    ([conversation(1)] * 6, ["~recovery.data._target_"], r"recovery.data=\{'chat_template': .*\} has no _target_ naming "
                                                        r"its class; give a name of \['alpaca', 'file', 'wikitext2', 'task'\]"),
])
def test_a_packages_bad_recovery_data_is_refused_before_the_model_loads(mylab, tmp_path, records, overrides, message):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ConfigError, match=message):
        validate(chat_cfg(path, *overrides))


def test_the_packages_export_format_writes_a_checkpoint_that_loads_back_equal(mylab, store, tmp_path):
    """mylab's bit-mask format, one class (mylab/export.py) and one YAML (conf/export/bitmask.yaml):
    a job with export=bitmask logs its pruned weights as a logged model of the run, in fewer bytes than
    the dense tensors, and they load back equal to the model the job evaluated."""
    from helpers.export import exported_folder, last_run
    from mylab.export import load_state_dict
    from prunebench.job import run
    from prunebench.pruning import prune

    cfg = compose_cfg([SEARCHPATH, "model=tiny-llama", "pruner=magnitude", "sparsity=0.5", "task=units_mc", "limit=4",
                       "tracking.ensure_dense=false", "export=bitmask", *QUIET])
    run(cfg)
    pruned = last_run()
    folder = exported_folder(pruned, tmp_path)
    model = mlflow.get_logged_model(pruned.data.tags["prunebench.export"].removeprefix("mlflow-model:models:/"))
    assert model.tags["prunebench.export_format"] == "bitmask" and model.model_type == "safetensors-bitmask"
    state = load_state_dict(folder)
    # magnitude pruning is deterministic: rebuilt, it is the model the job evaluated
    expected = prune(cfg, dense=False)[0].model.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], expected[name]) and state[name].dtype == expected[name].dtype for name in state)
    unique = {tensor.untyped_storage().data_ptr(): tensor for tensor in state.values()}.values()
    assert sum(int((t != 0).sum()) for t in unique) == pruned.data.metrics["params/nonzero"]
    pruning = json.loads((folder / "pruning.json").read_text())
    assert pruning["run_id"] == pruned.info.run_id and pruning["sparsity"] == 0.5
    # every matrix magnitude pruned is masked (half its entries zero); the embeddings and norms are dense
    assert {name for name in pruning["masked"]} == {name for name in expected if name.endswith("proj.weight")}
    assert pruning["bytes_stored"] < pruning["bytes_dense"]
