"""The lm-eval task index kept in prunebench's cache gives back what lm-eval's own TaskManager builds."""

from __future__ import annotations

import datetime
import os

from prunebench.tasks.lm_eval_index import cached_index, folder_digest, read_index, task_manager, write_index

GROUP = """group: my_group
task:
  - my_boolq
  - boolq
aggregate_metric_list:
  - metric: acc
"""
# the user's boolq overrides lm-eval's, as a later include_path folder does in TaskManager
TASK = """include: _template
task: {name}
tag: my_tag
"""


def user_tasks(folder):
    folder.mkdir(exist_ok=True)
    (folder / "_template").write_text("dataset_path: json\noutput_type: multiple_choice\ndoc_to_text: !function utils.text\n"
                                      "test_split: test\ndoc_to_target: 0\ndoc_to_choice: [a, b]\n")
    for name in ("my_boolq", "boolq"):
        (folder / f"{name}.yaml").write_text(TASK.format(name=name))
    (folder / "my_group.yaml").write_text(GROUP)
    return folder


def comparable(manager) -> tuple:
    return (manager.task_index, manager.all_tasks, manager.all_subtasks, manager.all_groups, manager.all_tags)


def test_cached_manager_equals_lm_evals_own_built_then_read(tmp_path, monkeypatch, caplog):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    folder = str(user_tasks(tmp_path / "mine"))
    reference = comparable(TaskManager(include_path=folder))
    built = comparable(task_manager([folder]))  # the built-in index built and written
    assert len(list((tmp_path / "cache" / "lm_eval_index").glob("*.json"))) == 1
    read = comparable(task_manager([folder]))  # and read back
    assert built == reference and read == reference
    assert reference[0]["boolq"].yaml_path.parent.name == "mine"
    assert "Task 'boolq' from" in caplog.text  # lm-eval's warning on an overridden task, kept


def test_a_config_json_cannot_carry_is_read_again_from_its_yaml(tmp_path):
    from lm_eval.tasks._index import TaskIndex

    folder = user_tasks(tmp_path / "mine")
    (folder / "dated.yaml").write_text("task: dated\nsince: 2024-01-31\nweights: {1: 0.5, 2: 0.5}\n")
    index = TaskIndex.build([folder])
    assert isinstance(index["dated"].cfg["since"], datetime.date)
    write_index(index, tmp_path / "index.json")
    assert read_index(tmp_path / "index.json") == index


def test_the_key_follows_every_file_and_an_unreadable_cache_is_built_again(tmp_path, monkeypatch, caplog):
    folder = user_tasks(tmp_path / "mine")
    before = folder_digest(folder)
    template = folder / "_template"  # an include without .yaml: a change there changes the configs
    os.utime(template, ns=(template.stat().st_atime_ns, template.stat().st_mtime_ns + 1000))
    assert folder_digest(folder) != before
    changed = folder_digest(folder)
    (folder / "__pycache__").mkdir()  # what loading a task's !function writes: no part of the index
    (folder / "__pycache__" / "utils.cpython-311.pyc").write_bytes(b"\0")
    assert folder_digest(folder) == changed
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    first = cached_index(folder, "0")
    (cached,) = (tmp_path / "cache" / "lm_eval_index").glob("*.json")
    cached.write_text(cached.read_text()[:100])  # a write cut short
    assert cached_index(folder, "0") == first
    assert "unreadable" in caplog.text and read_index(cached) == first
