"""The DFlash / DFlash2 draft model against the `dflash` package (0.1.0 on PyPI, its
DFlashDraftModel and DFlash2DraftModel): tiny random drafts saved as the package saves them, the
same tapped target features and block embeddings, and the engine's forward (its paged-cache
attention layout: every block row sees the context and the whole block) gives the package's hidden
states and logits within 1e-4; DFlash2's selector picks the same path greedily, and at temperature
1 the same distributions and draws for fixed uniforms."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

DFLASH_WHEEL = "dflash-0.1.0-py3-none-any.whl"
VOCAB, HIDDEN, TARGET_LAYERS = 96, 64, 6


@pytest.fixture(scope="module")
def dflash():
    """The package's model module, imported from its wheel (its pinned dependencies are the
    benchmark's, not the model's): from $REVOLTA_TEST_DATA when set, else downloaded."""
    data = os.environ.get("REVOLTA_TEST_DATA")
    with tempfile.TemporaryDirectory() as d:
        wheel = Path(data or d) / DFLASH_WHEEL
        if not wheel.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", d, "dflash==0.1.0"],
                           check=True)
            wheel = Path(d) / DFLASH_WHEEL
        sys.path.insert(0, str(wheel))
        try:
            import dflash.model as model

            yield model
        finally:
            sys.path.remove(str(wheel))


def make_draft(dflash, out: Path, kind: str):
    from transformers import Qwen3Config

    torch.manual_seed(7 if kind == "dflash2" else 5)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.num_target_layers = TARGET_LAYERS
    block = {"block_size": 6, "mask_token_id": VOCAB - 1}
    if kind == "dflash2":
        block.update(conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=5)
    cfg.dflash_config = block
    cls = dflash.DFlash2DraftModel if kind == "dflash2" else dflash.DFlashDraftModel
    cfg.architectures = [cls.__name__]
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "base_kernel" in name:  # torch.empty in the package, which leaves it to training
                p.copy_(0.3 * torch.randn_like(p))
            elif "norm" in name or "codebook" in name:  # away from their init (ones; std 0.02)
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    return model


def reference(dflash, model, context, noise, head, anchor, temperature, uniforms, monkeypatch):
    """The package's forward (a fresh cache: context at positions [0, C), the block after it) and,
    for DFlash2, its selector over the mask rows, its draws taken by the inverse CDF of `uniforms`."""
    C, B = context.shape[0], noise.shape[0]
    with torch.no_grad():
        hidden = model(target_hidden=torch.from_numpy(context)[None], noise_embedding=torch.from_numpy(noise)[None],
                       position_ids=torch.arange(C + B)[None])
        lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        lm_head.weight.copy_(torch.from_numpy(head))
        logits = model.compute_logits(hidden, lm_head)
        if not isinstance(model, dflash.DFlash2DraftModel):
            return hidden[0].numpy(), logits[0].numpy(), None
        draws = iter(uniforms)

        def inverse_cdf(q):
            u = next(draws)
            return torch.searchsorted(q.cumsum(-1), torch.tensor([[u]], dtype=q.dtype), right=True).clamp_max(q.shape[-1] - 1)[:, 0]

        topk = torch.topk
        monkeypatch.setattr(torch, "topk", lambda *a, **k: topk(*a, **{**k, "sorted": True}))  # a fixed candidate order
        monkeypatch.setattr(dflash, "_sample_probs", inverse_cdf)
        path = model.propose(hidden[:, 1:], torch.tensor([anchor]), lm_head, temperature)
        monkeypatch.undo()
    return hidden[0].numpy(), logits[0].numpy(), path


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_matches_the_dflash_package(dflash, tmp_path, kind, temperature, monkeypatch):
    from revolta import _core

    model = make_draft(dflash, tmp_path, kind)
    rng = np.random.default_rng(3)
    taps = len(model.target_layer_ids)
    assert taps == 2  # the package's default: one target layer per draft layer
    context = rng.standard_normal((11, taps * HIDDEN)).astype(np.float32)
    noise = rng.standard_normal((6, HIDDEN)).astype(np.float32)
    head = (0.2 * rng.standard_normal((VOCAB, HIDDEN))).astype(np.float32)
    uniforms = rng.random(5).tolist()
    ref_hidden, ref_logits, path = reference(dflash, model, context, noise, head, 17, temperature, uniforms, monkeypatch)
    got = _core.ops.dflash_draft(str(tmp_path), context, noise, head, anchor=17, temperature=temperature,
                                 uniforms=uniforms)
    np.testing.assert_allclose(got["hidden"], ref_hidden, atol=1e-4)
    np.testing.assert_allclose(got["logits"], ref_logits, atol=1e-4)
    assert (got["logits"][1:].argmax(-1) == ref_logits[1:].argmax(-1)).all()  # DFlash's greedy block
    if path is None:
        return
    tokens, candidates, q = path
    assert got["tokens"] == tokens[0].tolist()
    assert got["candidates"] == candidates[0].tolist()
    if temperature > 0:
        np.testing.assert_allclose(np.array(got["q"]), q[0].numpy(), atol=1e-5)
    else:
        assert got["q"] == []


def test_bad_configs_are_named(dflash, tmp_path):
    import json

    from revolta import _core

    make_draft(dflash, tmp_path, "dflash")
    cfg = json.loads((tmp_path / "config.json").read_text())
    args = (np.zeros((2, 2 * HIDDEN), np.float32), np.zeros((3, HIDDEN), np.float32), np.zeros((VOCAB, HIDDEN), np.float32))
    for change, message in [({"dflash_config": {"block_size": 6}}, "mask_token_id"),
                            ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
                            ({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash draft")]:
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ValueError, match=message):
            _core.ops.dflash_draft(str(tmp_path), *args)
