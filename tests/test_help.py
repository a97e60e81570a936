"""`prunebench --help` describes prunebench: its groups with their options and the common keys,
without the internal groups (task_library) Hydra's own help would list."""

from __future__ import annotations

import subprocess
import sys


def test_help_lists_the_groups_and_common_keys_and_hides_internal_groups():
    proc = subprocess.run([sys.executable, "-m", "prunebench", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert text.startswith("prunebench: evaluate pruned models")
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ": " in line}
    assert "magnitude" in lines["pruner"] and "tiny-llama" in lines["model"] and "local_mc" in lines["task"]
    assert "joblib" in lines["hydra/launcher"]
    for key in ("sparsity=0.5", "limit=N", "data_dir=DIR", "tracking.uri=URI", "$MLFLOW_TRACKING_URI"):
        assert key in text, key
    assert "task_library" not in text and "powered by Hydra" not in text
