"""The scorers apply the LM head at scored positions only; that must equal the model's own output
path, for the families that scale or cap their logits, and a model doing anything else is refused."""

from __future__ import annotations

import pytest
import torch

from conftest import reordered
from prunebench.models.tiny import load_tiny

BASE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64}
FAMILIES = {"cohere": {"model_type": "cohere", "logit_scale": 0.0625},
            "granite": {"model_type": "granite", "logits_scaling": 8.0},
            "gemma2": {"model_type": "gemma2", "final_logit_softcapping": 0.5, "head_dim": 8},
            "llama": {"model_type": "llama"}}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_head_at_selected_positions_equals_the_models_own_logits(family):
    loaded = load_tiny(name=family, config={**BASE, **FAMILIES[family]}, seed=1)
    ids = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = loaded.model(input_ids=ids).logits
        got = loaded.lm_logits(loaded.decoder()(input_ids=ids).last_hidden_state)
    torch.testing.assert_close(got, want, **reordered(want, depth=2))  # the same ops, 2 layers
    loaded.check_lm_head()


def test_an_unknown_output_path_is_refused():
    loaded = load_tiny(name="odd", config={**BASE, "model_type": "llama"}, seed=1)
    forward = loaded.model.forward

    def scaled(*args, **kwargs):  # a family that rescales its logits in a way lm_logits does not know
        out = forward(*args, **kwargs)
        out.logits = out.logits * 3
        return out

    loaded.model.forward = scaled
    with pytest.raises(ValueError, match="does not know"):
        loaded.check_lm_head()
