"""SliceGPT against the released algorithm (microsoft/TransformerCompression), rewritten here step
by step on tiny-llama: replace_layers and fuse_modules (layernorm_fusion.py, modules.RMSN), then
rotate_and_slice_sequential with pca_calc, get_layer0_inputs and get_signals (rotate.py,
model_utils.py) under run_slicegpt.py's ConstSlicingScheduler, final_orientation=pca, head unsliced."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from conftest import compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.models.tiny import load_tiny
from prunebench.paths import CONF_DIR
from prunebench.pruners.slicegpt import SliceGPTPruner, check_llama_like
from prunebench.validate import validate

BATCH = 4


def tiny_llama():
    """conf/model/tiny-llama.yaml with Llama-2's rms_norm_eps, 1e-5: the release's RMSN hard-codes
    that eps (ours takes the model's), so the reference below is the release's own arithmetic. Its
    norms' scales, initialised to ones, are drawn at random, or folding them would change nothing."""
    options = OmegaConf.to_container(OmegaConf.load(f"{CONF_DIR}/model/tiny-llama.yaml"))
    options.pop("_target_")
    options["config"]["rms_norm_eps"] = 1e-5
    lm = load_tiny(**options)
    generator = torch.Generator().manual_seed(2)
    for norm in [m for m in lm.model.modules() if isinstance(m, LlamaRMSNorm)]:
        norm.weight.data = torch.empty_like(norm.weight).uniform_(0.5, 1.5, generator=generator)
    return lm


class Windows:
    def samples(self, tokenizer):
        return torch.randint(3, len(tokenizer), (8, 32), generator=torch.Generator().manual_seed(0))


def batches(lm) -> list[dict]:
    return SliceGPTPruner(batch_size=BATCH).score(lm, Windows())


def ids(lm):
    return torch.randint(3, lm.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


# ---- the release, step by step ---------------------------------------------------------------


class ReleaseRMSN(nn.Module):
    """modules.RMSN: no weight, sum of squares divided by the ORIGINAL hidden size (mean_dim)."""

    def __init__(self, mean_dim: int):
        super().__init__()
        self.eps, self.mean_dim = 1e-5, mean_dim

    def forward(self, x):
        variance = x.pow(2).sum(-1, keepdim=True) / self.mean_dim
        return x * torch.rsqrt(variance + self.eps)


class ReleaseLayer(LlamaDecoderLayer):
    """CompressibleLlamaDecoderLayer: each residual multiplied by its shortcut Q before the sum."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.attn_shortcut_Q = self.mlp_shortcut_Q = None

    def forward(self, hidden_states, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = (residual if self.attn_shortcut_Q is None else residual @ self.attn_shortcut_Q) + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return (residual if self.mlp_shortcut_Q is None else residual @ self.mlp_shortcut_Q) + hidden_states


def release_fuse(model):
    """replace_layers, then fuse_modules with should_bake_mean_into_linear False (Llama)."""
    layers = model.model.layers
    for i, layer in enumerate(layers):
        new = ReleaseLayer(model.config, i)
        new.load_state_dict(layer.state_dict(), strict=True)
        layers[i] = new.eval()
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.clone())
    embed = model.model.embed_tokens.weight
    embed.data = (embed.data.double() - embed.data.double().mean(dim=-1, keepdim=True)).to(embed.dtype)

    def fuse_ln_linear(norm, linears):
        for linear in linears:
            linear.weight.data = (linear.weight.data.double() * norm.weight.double()).to(linear.weight.dtype)

    for layer in layers:
        fuse_ln_linear(layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
        fuse_ln_linear(layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj])
    fuse_ln_linear(model.model.norm, [model.lm_head])
    hidden = model.config.hidden_size
    for layer in layers:
        layer.input_layernorm, layer.post_attention_layernorm = ReleaseRMSN(hidden), ReleaseRMSN(hidden)
    model.model.norm = ReleaseRMSN(hidden)


def pca_calc(xs):
    H = None
    for x in xs:
        x = x.double()
        h = torch.sum(x.mT @ x, dim=0)
        H = h if H is None else H + h
    damp = 0.01 * torch.mean(torch.diag(H))
    diag = torch.arange(H.shape[-1])
    H[diag, diag] = H[diag, diag] + damp
    values, vectors = torch.linalg.eigh(H)
    index = torch.argsort(values, descending=True)
    return vectors[:, index]


def layer0_inputs(model, batch):
    class Catcher(nn.Module):
        def forward(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs
            raise ValueError

    layer0, catcher = model.model.layers[0], Catcher()
    model.model.layers[0] = catcher
    try:
        model(**batch)
    except ValueError:
        pass
    model.model.layers[0] = layer0
    return catcher.args[0], catcher.args, catcher.kwargs


def signals(layer, args, kwargs):
    mlp_ln_inputs, outputs = [], []
    hook = layer.post_attention_layernorm.register_forward_hook(lambda m, a, o: mlp_ln_inputs.append(a[0]))
    for a, k in zip(args, kwargs):
        out = layer(*a, **k)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    hook.remove()
    return mlp_ln_inputs, outputs


@torch.no_grad()
def release_slicegpt(model, loader, sparsity: float, round_interval: int = 8):
    release_fuse(model)
    hidden = model.config.hidden_size
    d = int((1 - sparsity) * hidden)
    d -= d % round_interval
    dtype = next(iter(model.parameters())).dtype
    inps, args, kwargs = [], [], []
    for batch in loader:
        inp, a, k = layer0_inputs(model, {"input_ids": batch["input_ids"], "use_cache": False})
        inps.append(inp)
        args.append(a)
        kwargs.append(k)
    Q = pca_calc(inps)
    embed = model.model.embed_tokens
    embed.weight.data = (embed.weight.data.double() @ Q).to(dtype)[:, :d]
    layers = model.model.layers
    for idx, layer in enumerate(layers):
        attn_in = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
        mlp_in = [layer.mlp.gate_proj, layer.mlp.up_proj]
        layer.attn_shortcut_Q = Q.T.clone().to(dtype)
        for W in attn_in:
            W.weight.data = (W.weight.data.double() @ Q).to(dtype)[:, :d]
        layer.attn_shortcut_Q = layer.attn_shortcut_Q[:d, :]
        for i, inp in enumerate(inps):
            args[i] = ((inp @ Q.to(dtype))[:, :, :d], *args[i][1:])
        mlp_ln_inputs, _ = signals(layer, args, kwargs)
        Q = pca_calc(mlp_ln_inputs)
        layer.attn_shortcut_Q = layer.attn_shortcut_Q @ Q.to(dtype)[:, :d]
        o = layer.self_attn.o_proj
        o.weight.data = (Q.T @ o.weight.data.double()).to(dtype)[:d, :]
        layer.mlp_shortcut_Q = Q.T.clone().to(dtype)[:d, :]
        for W in mlp_in:
            W.weight.data = (W.weight.data.double() @ Q).to(dtype)[:, :d]
        _, inps = signals(layer, args, kwargs)
        Q = pca_calc(inps)
        layer.mlp_shortcut_Q = layer.mlp_shortcut_Q @ Q.to(dtype)
        d_out = hidden if idx == len(layers) - 1 else d  # do_slice_head=False: the head's dimension
        down = layer.mlp.down_proj
        down.weight.data = (Q.T @ down.weight.data.double()).to(dtype)[:d_out, :]
        layer.mlp_shortcut_Q = layer.mlp_shortcut_Q[:, :d_out]
    model.lm_head.weight.data = (model.lm_head.weight.data.double() @ Q).to(dtype)


# ---- comparisons -----------------------------------------------------------------------------


def sliced_weights(model) -> dict[str, torch.Tensor]:
    out = {"embed": model.model.embed_tokens.weight, "head": model.lm_head.weight}
    for i, layer in enumerate(model.model.layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{i}.{name}"] = getattr(layer.self_attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{i}.{name}"] = getattr(layer.mlp, name).weight
        out[f"{i}.attn_shortcut"], out[f"{i}.mlp_shortcut"] = layer.attn_shortcut_Q, layer.mlp_shortcut_Q
    return {k: v.detach() for k, v in out.items()}


def align_signs(ours: dict, ref: dict, n_layers: int) -> dict:
    """An eigenvector is defined up to its sign: each basis (the embeddings', each block's middle
    and output) gets the sign that matches the reference on one weight it indexes, then every
    weight is flipped by the signs of the bases it is written in."""

    def signs(a, b, dim):
        return torch.sign((a * b).sum(dim))

    basis_in = [signs(ours["embed"], ref["embed"], 0)]
    mid, out = [], []
    for i in range(n_layers):
        mid.append(signs(ours[f"{i}.o_proj"], ref[f"{i}.o_proj"], 1))
        out.append(signs(ours[f"{i}.down_proj"], ref[f"{i}.down_proj"], 1))
        basis_in.append(out[-1])
    fixed = {"embed": ours["embed"] * basis_in[0], "head": ours["head"] * out[-1]}
    for i in range(n_layers):
        for name in ("q_proj", "k_proj", "v_proj"):
            fixed[f"{i}.{name}"] = ours[f"{i}.{name}"] * basis_in[i]
        fixed[f"{i}.o_proj"] = ours[f"{i}.o_proj"] * mid[i][:, None]
        for name in ("gate_proj", "up_proj"):
            fixed[f"{i}.{name}"] = ours[f"{i}.{name}"] * mid[i]
        fixed[f"{i}.down_proj"] = ours[f"{i}.down_proj"] * out[i][:, None]
        fixed[f"{i}.attn_shortcut"] = basis_in[i][:, None] * ours[f"{i}.attn_shortcut"] * mid[i]
        fixed[f"{i}.mlp_shortcut"] = mid[i][:, None] * ours[f"{i}.mlp_shortcut"] * out[i]
    return fixed


def test_rotated_model_at_no_slicing_computes_the_fused_model():
    """At 0% slicing SliceGPT only fuses and rotates: the logits are the model's with mean-centred
    embedding rows (the release centres them for Llama too, which RMSNorm does not undo; that is
    the only change). Each weight is rotated in float64 and rounded once to fp32, and dot products of
    64 terms are re-associated: a few fp32 ulps a layer, far below 1e-5 on logits of order 1."""
    lm, dense = tiny_llama(), tiny_llama()
    tokens = ids(lm)
    embed = dense.model.get_input_embeddings().weight
    embed.data -= embed.data.mean(-1, keepdim=True)
    pruner = SliceGPTPruner(batch_size=BATCH)
    stats = pruner.apply(lm, pruner.score(lm, Windows()), 0.0)
    assert stats["sparsity/actual"] == 0.0
    torch.testing.assert_close(logits(lm.model, tokens), logits(dense.model, tokens), rtol=0, atol=1e-5)
    # and the rotation did happen: a weight matrix is no longer the (fused) original
    fused = dense.model.model.layers[0].self_attn.q_proj.weight * dense.model.model.layers[0].input_layernorm.weight
    assert (lm.model.model.layers[0].self_attn.q_proj.weight - fused).abs().max() > 1e-2


@pytest.mark.parametrize("sparsity", [0.25, 0.5])
def test_sliced_weights_and_logits_equal_the_released_algorithm(sparsity):
    """Both sides run the same float64 eigendecompositions on Gram matrices summed in other orders
    (float64, so 1e-16 apart), so after the sign alignment the fp32 weights agree to a few ulps."""
    lm, ref = tiny_llama(), tiny_llama()
    samples = batches(lm)
    stats = SliceGPTPruner(batch_size=BATCH).apply(lm, samples, sparsity)
    release_slicegpt(ref.model, samples, sparsity)
    width = ref.model.model.embed_tokens.weight.shape[1]
    assert width == {0.25: 48, 0.5: 32}[sparsity] and stats["sparsity/actual"] == 1 - width / 64
    ours, theirs = sliced_weights(lm.model), sliced_weights(ref.model)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    fixed = align_signs(ours, theirs, len(ref.model.model.layers))
    for name, weight in fixed.items():
        torch.testing.assert_close(weight, theirs[name], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    tokens = ids(lm)
    torch.testing.assert_close(logits(lm.model, tokens), logits(ref.model, tokens), rtol=1e-4, atol=1e-5)
    assert stats["sparsity/params"] > 0 and stats["sparsity/flops"] > 0


def test_sliced_model_decodes_with_its_kv_cache_as_its_full_forward():
    lm = tiny_llama()
    pruner = SliceGPTPruner(batch_size=BATCH)
    pruner.apply(lm, pruner.score(lm, Windows()), 0.25)
    prompt = ids(lm)[:1]
    with torch.no_grad():
        out = lm.model.generate(prompt, max_new_tokens=6, do_sample=False)
        step = lm.model(out[:, :-1]).logits[0, -6:].argmax(-1)
    assert torch.equal(step, out[0, -6:])


def test_blocks_with_post_norms_or_unfoldable_norms_are_refused():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gemma3_text", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="post_feedforward_layernorm"):
        check_llama_like(AutoModelForCausalLM.from_config(config))
    lm = tiny_llama()
    lm.model.model.layers[0].input_layernorm = nn.LayerNorm(64)
    with pytest.raises(ValueError, match="LayerNorm does not compute weight"):
        check_llama_like(lm.model)


def test_gemma_and_export_are_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match="model_type 'gemma3_text': Gemma 2 and 3 normalise"):
        validate(compose_cfg(["model=gemma3-270m", "task=wikitext2_ppl", "pruner=slicegpt", "calib=wikitext2",
                              "sparsity=0.25"]))
    with pytest.raises(ConfigError, match="shortcut matrix on every block's residual path"):
        validate(compose_cfg(["model=tiny-llama", "task=wikitext2_ppl", "pruner=slicegpt", "calib=wikitext2",
                              "sparsity=0.25", "export=hf"]))


def test_slicegpt_job_records_perplexity_and_what_slicing_removed(store, tmp_path, monkeypatch):
    from prunebench.job import run

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    text = "The quick brown fox jumps over the lazy dog. Question: What is the capital of France? Paris. "
    for split in ("train", "test"):
        (tmp_path / "wikitext2" / f"wiki.{split}.raw").write_text(f"= {split} =\n" + text * 60)
    metrics = run(compose_cfg(["model=tiny-llama", "task=wikitext2_ppl", f"++data_dir={tmp_path}",
                               "task.tasks.wikitext2_ppl.seq_len=32", "pruner=slicegpt", "pruner.batch_size=2",
                               "calib=wikitext2", "calib.n_samples=4", "calib.seq_len=32", "sparsity=0.25",
                               "tracking.ensure_dense=false", "trainer.enable_progress_bar=false"]))
    assert metrics["sparsity/actual"] == 0.25 and metrics["sparsity/params"] > 0
    assert math.isfinite(metrics["wikitext2_ppl/ppl"]) and metrics["wikitext2_ppl/ppl"] > 1


def test_a_ratio_that_leaves_no_dimension_is_refused_before_the_model_loads(tmp_path):
    from conftest import TINY_MC
    from prunebench.validate import ConfigError

    text = tmp_path / "calib.txt"
    text.write_text("some calibration text " * 50)
    cfg = compose_cfg([*TINY_MC, "pruner=slicegpt", "sparsity=0.99", "calib=file", f"calib.path={text}"])
    with pytest.raises(ConfigError, match="sparsity=0.99 leaves no dimension of hidden_size=64"):
        validate(cfg)


def test_calibration_thinner_than_the_kept_width_is_warned_about_before_slicing(caplog):
    """tiny-llama keeps 48 of its 64 dimensions at sparsity 0.25; 8 windows of 32 tokens drawn from
    its vocabulary hold far more distinct tokens than that, 2 windows of 4 tokens cannot."""
    lm = tiny_llama()
    SliceGPTPruner(batch_size=BATCH).apply(lm, batches(lm), 0.25)
    assert "distinct tokens" not in caplog.text
    thin = [{"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}] * 2
    lm = tiny_llama()
    SliceGPTPruner(batch_size=BATCH).apply(lm, thin, 0.25)
    assert "SliceGPT keeps 48 dimensions, but the calibration holds 4 distinct tokens" in caplog.text
