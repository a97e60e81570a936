"""The one error a bad config raises, wherever it is found (validate.py, tasks/build.py), and the one
way a command refuses it."""

from __future__ import annotations

import sys
from typing import NoReturn

# a bad config is a usage error (argparse's and click's status for one): 2, not a failure's 1
CONFIG_ERROR_EXIT = 2


class ConfigError(ValueError):
    """A bad config value; the message names the value and what would be valid."""


def refuse(message: object) -> NoReturn:
    """One line on stderr says it all (no traceback, no second copy from Hydra), then the usage exit
    status: a single job and a sweep refused before it starts read alike."""
    print(f"prunebench: invalid config: {message}", file=sys.stderr, flush=True)
    raise SystemExit(CONFIG_ERROR_EXIT) from None
