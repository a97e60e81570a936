"""model.dtype=auto: resolved for the machine before anything loads, and recorded as resolved;
eval.numerics checked as early."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import FIXTURES, compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.api.model_keys import machine_dtype, run_dtype
from prunebench.tracking.tags import job_tags
from prunebench.models.cache import get_model
from prunebench.tracking.run_key import run_key
from prunebench.validate import validate


def test_auto_is_bf16_exactly_where_the_cpu_computes_it_natively():
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert machine_dtype("cpu") == ("bfloat16" if native else "float32")
    assert run_dtype(compose_cfg(["model=tiny-llama", "model.dtype=auto"]).model) == machine_dtype("cpu")
    assert run_dtype(compose_cfg(["model=tiny-llama", "model.dtype=float32"]).model) == "float32"


def test_auto_loads_keys_and_tags_the_resolved_dtype():
    auto = compose_cfg(["model=tiny-llama", "model.dtype=auto", "sparsity=0"])
    explicit = compose_cfg(["model=tiny-llama", f"model.dtype={machine_dtype('cpu')}", "sparsity=0"])
    other = "float32" if machine_dtype("cpu") == "bfloat16" else "bfloat16"
    assert run_key(auto) == run_key(explicit) != run_key(compose_cfg(["model=tiny-llama", f"model.dtype={other}",
                                                                      "sparsity=0"]))
    assert job_tags(auto, run_key(auto), [])["prunebench.dtype"] == machine_dtype("cpu")
    assert next(get_model(auto.model).model.parameters()).dtype == getattr(torch, machine_dtype("cpu"))


@pytest.mark.parametrize(("override", "named"), [("eval.numerics=exact", "eval.numerics='exact'"),
                                                 ("eval.lm_eval_batch_size=0", "eval.lm_eval_batch_size=0")])
def test_a_bad_numerics_setting_is_refused_before_anything_loads(override, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        validate(compose_cfg(["model=tiny-llama", "task=winogrande", f"data_dir={FIXTURES / 'benchmarks'}", override]))
