"""Quantized KV caches (kv_cache_dtype fp8 / int8) against the 16-bit cache: on every
architecture's tiny config, the logits of every generated step and greedy agreement, and on the
demo model over a long prompt; the pool grows by the bytes each format saves."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import first_divergence_on_near_tie, make_hf_model
from revolta import LLM, SamplingParams
from test_model_parity import CONFIGS

ARCHITECTURES = ["llama-gqa2-untied", "qwen3-gqa3-headdim32", "qwen3_moe-4x2", "qwen3_next-interval4", "qwen3_5_moe-mqa"]
GEN = 16
# The median over generated steps (those up to the first divergence) of max |logit - the 16-bit
# cache's logit|, relative to the largest logit: E4M3 keeps 3 mantissa bits (2^-4 relative per
# value), int8 a step of absmax / 127. (Medians: in an MoE model a rounding that flips a routing
# choice moves one step's logits by the experts' difference, past what the cache's error says.)
TOLERANCE = {"fp8": 0.06, "int8": 0.015}
# The demo model's K and V rows peak at 4-6x their RMS (3.4-5.9 for K by layer; 2.4 for Gaussian
# rows), so an int8 row's step, absmax / 127, is as coarse as E4M3's 3 mantissa bits there.
DEMO_TOLERANCE = 0.04
# Greedy tokens may part only where the 16-bit cache's top two logits lie within this share of the
# largest logit magnitude.
NEAR_TIE = {"fp8": 0.1, "int8": 0.03}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model_dir(request, tmp_path_factory):
    kind, overrides = CONFIGS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    make_hf_model(kind, d, **overrides)
    return str(d)


def generate(model: str, kv: str, prompts: list[list[int]], gen: int = GEN, **kw):
    llm = LLM(model, kv_cache_dtype=kv, max_model_len=kw.pop("max_model_len", 256), **kw)
    sp = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True, return_generation_logits=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp)
    return llm, [(o.outputs[0].token_ids, np.asarray(o.outputs[0].generation_logits)) for o in outs]


@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_quantized_cache_follows_the_16bit_cache(model_dir, kv):
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (9, 70, 101)]
    _, want = generate(model_dir, "float16", prompts)
    _, got = generate(model_dir, kv, prompts)
    worst = 0.0
    for (ref_ids, ref_logits), (ids, logits) in zip(want, got):
        first_divergence_on_near_tie(ref_ids, ids, ref_logits, NEAR_TIE[kv] * float(np.abs(ref_logits).max()))
        worst = max(worst, median_error(ref_ids, ref_logits, ids, logits))
    print(f"{kv}: worst median relative logit error {worst:.4f}")
    assert worst < TOLERANCE[kv]


def median_error(ref_ids, ref_logits, ids, logits) -> float:
    agree = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), len(ids))
    steps = max(1, agree)  # (at a divergence the next steps see other tokens)
    per_step = np.abs(logits[:steps] - ref_logits[:steps]).max(axis=1) / np.abs(ref_logits[:steps]).max()
    return float(np.median(per_step))


def test_demo_model_over_a_long_prompt(demo_model_dir):
    """About 1,450 tokens of prose, then 24 greedy tokens, through each cache format."""
    from revolta.models.tokenizer import Tokenizer

    text = " ".join(f"Chapter {i}: the river rose in the spring of year {1800 + i}, and the town built a wall of "
                    f"{i * 7 % 13 + 2} stones a day until the water fell." for i in range(40))
    prompt = Tokenizer(demo_model_dir).encode(text + " Summarise the story in one sentence:")
    assert len(prompt) > 1400
    runs = {kv: generate(demo_model_dir, kv, [prompt], gen=24, max_model_len=2048, kv_cache_memory_bytes=256 << 20)
            for kv in ("float16", "fp8", "int8")}
    ref_ids, ref_logits = runs["float16"][1][0]
    for kv in ("fp8", "int8"):
        ids, logits = runs[kv][1][0]
        first_divergence_on_near_tie(ref_ids, ids, ref_logits, NEAR_TIE[kv] * float(np.abs(ref_logits).max()))
        err = median_error(ref_ids, ref_logits, ids, logits)
        agree = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), len(ids))
        print(f"demo model, {len(prompt)}-token prompt, {kv}: {agree} of {len(ids)} greedy tokens agree, "
              f"median relative logit error {err:.4f}")
        assert err < DEMO_TOLERANCE
    # the pool in tokens grows by the bytes a format saves (head_dim 64: int8 rows carry a 4-byte scale)
    tokens = {kv: run[0].model_info.kv_cache_tokens for kv, run in runs.items()}
    print(f"pool of 256 MiB in tokens: {tokens}")
    assert tokens["fp8"] == 2 * tokens["float16"]
    assert abs(tokens["int8"] / tokens["float16"] - 128 / 68) < 0.01


# ---- the cache formats themselves, against torch ---------------------------------------------------


def torch_attention(q, k, v):
    """Causal attention of q (the last T positions) over k / v [S, kv_heads, D], GQA."""
    import torch

    T, H, D = q.shape
    S, KVH, _ = k.shape
    g = H // KVH
    k, v = torch.from_numpy(k).repeat_interleave(g, 1), torch.from_numpy(v).repeat_interleave(g, 1)
    scores = torch.einsum("thd,shd->hts", torch.from_numpy(q), k) / D**0.5
    pos = torch.arange(S - T, S)[:, None]
    scores = scores.masked_fill(torch.arange(S)[None, :] > pos, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).numpy()


def fp8_round_trip(x: np.ndarray, scale: float) -> np.ndarray:
    import torch

    return (torch.from_numpy(x / scale).to(torch.float8_e4m3fn).float() * scale).numpy()


def int8_round_trip(x: np.ndarray) -> np.ndarray:
    import torch

    t = torch.from_numpy(x)
    s = t.abs().amax(-1, keepdim=True) / 127
    return (torch.round(t / s).clamp(-127, 127) * s).numpy()


@pytest.mark.parametrize("kv", ["float16", "float8_e4m3", "int8"])
def test_attention_reads_what_torch_rounds(kv):
    """The cache's values are what torch's own rounding gives (E4M3 by torch.float8_e4m3fn, int8 by
    absmax / 127 per token and head, float16 by torch.half): attention over them agrees to float32
    rounding, while attention over the unrounded values does not."""
    from revolta import _core

    rng = np.random.default_rng(5)
    T, S, H, KVH, D = 3, 37, 4, 2, 32
    q = rng.standard_normal((T, H, D), dtype=np.float32)
    k = (rng.standard_normal((S, KVH, D)) * 3).astype(np.float32)
    v = rng.standard_normal((S, KVH, D), dtype=np.float32)
    k_scale, v_scale = 0.05, 0.02  # values up to ~300x the scale: the E4M3 range used, subnormals too
    out = np.zeros_like(q)
    _core.ops.paged_attention_cached(q, k, v, kv, k_scale, v_scale, 16, out)
    if kv == "float16":
        kr, vr = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    elif kv == "float8_e4m3":
        kr, vr = fp8_round_trip(k, k_scale), fp8_round_trip(v, v_scale)
    else:
        kr, vr = int8_round_trip(k), int8_round_trip(v)
    assert np.abs(out - torch_attention(q, kr, vr)).max() < 1e-5
    assert np.abs(out - torch_attention(q, k, v)).max() > 1e-4  # (the rounding is there to see)


def test_fp8_saturates_past_448_times_the_scale():
    from revolta import _core

    k = np.full((1, 1, 8), 1000.0, dtype=np.float32)
    k[0, 0, 1::2] = -1000.0
    v = k.copy()
    q = np.zeros((1, 1, 8), dtype=np.float32)
    out = np.zeros_like(q)
    _core.ops.paged_attention_cached(q, k, v, "float8_e4m3", 1.0, 2.0, 16, out)
    assert np.allclose(out[0, 0], np.where(np.arange(8) % 2, -896.0, 896.0))  # 448 x v_scale, no NaN


def test_calculated_scales_keep_values_past_the_e4m3_range(tmp_path):
    """K and V of a few thousand: E4M3 at scale 1.0 saturates at 448, scales measured by a pass over
    calibration prompts (calculate_kv_scales) follow the 16-bit cache."""
    import torch

    kind, overrides = CONFIGS["llama-gqa2-untied"]
    model = make_hf_model(kind, tmp_path, **overrides)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight *= 2000.0  # the same model: q . k and the output kept
            layer.self_attn.q_proj.weight /= 2000.0
            layer.self_attn.v_proj.weight *= 2000.0
            layer.self_attn.o_proj.weight /= 2000.0
    model.save_pretrained(tmp_path)
    rng = random.Random(4)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (12, 60)]
    calibration = [[rng.randrange(256) for _ in range(40)] for _ in range(3)]
    _, want = generate(str(tmp_path), "float16", prompts)
    _, fixed = generate(str(tmp_path), "fp8", prompts)
    _, measured = generate(str(tmp_path), "fp8", prompts, calculate_kv_scales=True, calibration_prompts=calibration)
    err = {name: max(median_error(r[0], r[1], g[0], g[1]) for r, g in zip(want, got))
           for name, got in (("fixed", fixed), ("measured", measured))}
    print(f"median relative logit error: scale 1.0 {err['fixed']:.4f}, measured {err['measured']:.4f}")
    assert err["measured"] < TOLERANCE["fp8"] < err["fixed"]
    # Tensor parallelism: each rank measures its KV head, a layer takes the larger; the answers follow TP 1's.
    _, split = generate(str(tmp_path), "fp8", prompts, calculate_kv_scales=True, calibration_prompts=calibration,
                        tensor_parallel_size=2)
    assert max(median_error(r[0], r[1], g[0], g[1]) for r, g in zip(measured, split)) < 1e-3


def test_calculate_kv_scales_options_are_checked(demo_model_dir):
    with pytest.raises(ValueError, match="calculate_kv_scales measures the scales of an fp8 KV cache"):
        LLM(demo_model_dir, kv_cache_dtype="int8", calculate_kv_scales=True)
