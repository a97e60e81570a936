"""Seeds as the generators they reach take them: torch's and numpy's an integer only, Python's
random.Random a string or a float too (making a seed of its own from it)."""

from __future__ import annotations

import logging

from prunebench.api.errors import ConfigError

log = logging.getLogger(__name__)


def torch_seed(owner: str, seed) -> int:
    """`seed` for torch's or numpy's generator, which take only an integer (Python's random takes a
    string too, `warn_seed`); ValueError naming `owner`, the option that seeds it."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{owner}: seed={seed!r} seeds torch's or numpy's generator, which takes an integer (seed=0)")
    return seed


def warn_seed(seed) -> None:
    """The root `seed` reaches Python's random.Random (calibration draws, MoP's L/G sequence,
    labelled batches), which makes a seed of its own from a string or a float: repeatable, but not an
    integer seed's draws; said once. Torch's and numpy's generators refuse it (`torch_seed`)."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return
    if seed is None:
        becomes = "seeds from the operating system's randomness, so no two runs draw alike"
    elif isinstance(seed, str):
        becomes = "seeds with the integer of the string's bytes and their SHA-512: repeatable, but no integer seed's draws"
    elif isinstance(seed, (bool, float)):
        becomes = f"seeds with hash({seed!r}) = {hash(seed)}"
    else:
        raise ConfigError(f"seed={seed!r}: use an integer, such as seed=0")
    log.warning("seed=%r is not an integer: random.Random, which draws calibration samples (and MoP's L/G steps) "
                "with it, %s; use an integer, such as seed=0", seed, becomes)
