"""The config groups: an override of the retired task_library group is refused in one line that
names its new spelling, before Hydra composes anything."""

from __future__ import annotations

import sys

import pytest

from prunebench import cli
from prunebench.api.errors import CONFIG_ERROR_EXIT
from prunebench.groups import retired_spelling

RETIRED = {
    "task_library@calib.task=cola": "write task@calib.task=cola (its definition is then calib.task.tasks.cola)",
    "+task_library@recovery.task=local_mc": "write +task@recovery.task=local_mc (its definition is then "
                                            "recovery.task.tasks.local_mc)",
    "+task_library@task.tasks.openbookqa=openbookqa": "task=[SUITE,openbookqa] task.name=SUITE",
    "+task_library/opencompass@task.protocols.opencompass.piqa=piqa": "task=[SUITE,piqa] task.name=SUITE",
}


@pytest.mark.parametrize("override", sorted(RETIRED))
def test_a_task_library_override_is_told_its_new_spelling(override):
    message = retired_spelling(override)
    assert message.startswith(f"{override}: conf/task_library is gone") and RETIRED[override] in message


@pytest.mark.parametrize("override", ["task@calib.task=cola", "task=[commonsense,openbookqa]", "task_name=x", "calib=task"])
def test_other_overrides_are_not_retired(override):
    assert retired_spelling(override) is None


def test_the_cli_refuses_a_retired_spelling_in_one_line_before_composing(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["prunebench", "model=tiny-llama", "task_library@calib.task=cola"])
    monkeypatch.setattr(cli, "app", lambda: pytest.fail("Hydra composed a retired spelling"))
    with pytest.raises(SystemExit) as end:
        cli.main()
    assert end.value.code == CONFIG_ERROR_EXIT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "write task@calib.task=cola" in err
    assert cli.plan_main(["task_library@calib.task=cola"]) == CONFIG_ERROR_EXIT
