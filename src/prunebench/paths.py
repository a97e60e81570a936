"""Where the Hydra configs live: read by the entry point and by the report (suite definitions)."""

from __future__ import annotations

from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
