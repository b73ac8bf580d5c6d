"""Gated DeltaNet CPU ops against independent references: a naive per-token recurrence written
from the definition, and HF transformers' own torch implementations (Qwen3-Next)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from revolta import _core

qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def l2n(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def make_inputs(T, Hk, Hv, Dk, Dv, seed):
    r = np.random.default_rng(seed)
    q = l2n(r.standard_normal((T, Hk, Dk))).astype(np.float32)
    k = l2n(r.standard_normal((T, Hk, Dk))).astype(np.float32)
    v = r.standard_normal((T, Hv, Dv)).astype(np.float32)
    g = (-np.log1p(np.exp(r.standard_normal((T, Hv)) + 1.0)) * 0.5).astype(np.float32)  # log decay < 0
    beta = (1 / (1 + np.exp(-r.standard_normal((T, Hv))))).astype(np.float32)
    s0 = (0.1 * r.standard_normal((Hv, Dk, Dv))).astype(np.float32)
    return q, k, v, g, beta, s0


def naive(q, k, v, g, beta, s0):
    """S_t = a S + k (beta (v - a S^T k))^T with a = exp(g); o_t = S_t^T q / sqrt(Dk). float64."""
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    S = s0.astype(np.float64).copy()
    out = np.zeros((T, Hv, Dv))
    for t in range(T):
        for h in range(Hv):
            kh, qh = k[t, h // (Hv // Hk)].astype(np.float64), q[t, h // (Hv // Hk)].astype(np.float64)
            S[h] *= np.exp(g[t, h])
            delta = beta[t, h] * (v[t, h] - S[h].T @ kh)
            S[h] += np.outer(kh, delta)
            out[t, h] = S[h].T @ qh / np.sqrt(Dk)
    return out, S


def ours(q, k, v, g, beta, s0, chunk):
    state = s0.copy()
    out = np.zeros((q.shape[0], v.shape[1], v.shape[2]), np.float32)
    _core.ops.gated_delta_rule(q, k, v, g, beta, state, out, chunk)
    return out, state


@pytest.mark.parametrize("T,Hk,Hv,Dk,Dv", [(300, 2, 4, 32, 48), (64, 1, 1, 16, 16), (130, 3, 6, 24, 40)])
@pytest.mark.parametrize("chunk", [1, 64])
def test_against_naive_recurrence(T, Hk, Hv, Dk, Dv, chunk):
    inputs = make_inputs(T, Hk, Hv, Dk, Dv, seed=T + Hv)
    ref_out, ref_state = naive(*inputs)
    out, state = ours(*inputs, chunk)
    assert np.abs(out - ref_out).max() < 1e-4
    assert np.abs(state - ref_state).max() < 1e-4


def test_against_transformers_chunked_and_recurrent():
    q, k, v, g, beta, s0 = make_inputs(200, 2, 4, 32, 32, seed=1)
    t = lambda x: torch.from_numpy(x)[None]  # noqa: E731  add the batch dimension
    ref_c, ref_cs = qn.torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), initial_state=torch.from_numpy(s0)[None],
                                                    output_final_state=True)
    ref_r, ref_rs = qn.torch_recurrent_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), initial_state=torch.from_numpy(s0)[None],
                                                        output_final_state=True)
    for chunk in (1, 64):
        out, state = ours(q, k, v, g, beta, s0, chunk)
        for ref, ref_state in ((ref_c, ref_cs), (ref_r, ref_rs)):
            assert np.abs(out - ref[0].numpy()).max() < 1e-4
            assert np.abs(state - ref_state[0].numpy()).max() < 1e-4


def test_state_carries_across_split_sequences():
    q, k, v, g, beta, s0 = make_inputs(250, 2, 2, 16, 16, seed=3)
    full, full_state = ours(q, k, v, g, beta, s0, 64)
    state, pieces = s0.copy(), []
    for a, b in ((0, 37), (37, 101), (101, 102), (102, 250)):  # chunk budgets that split GDN chunks
        out = np.zeros((b - a, 2, 16), np.float32)
        args = [np.ascontiguousarray(x[a:b]) for x in (q, k, v, g, beta)]
        _core.ops.gated_delta_rule(*args, state, out, 64 if b - a > 1 else 1)
        pieces.append(out)
    assert np.abs(np.concatenate(pieces) - full).max() < 1e-4
    assert np.abs(state - full_state).max() < 1e-4


def test_causal_conv1d_against_transformers():
    r = np.random.default_rng(0)
    T, C, W = 23, 40, 4
    x = r.standard_normal((T, C)).astype(np.float32)
    w = r.standard_normal((C, W)).astype(np.float32)
    ref = qn.causal_conv1d_fn(torch.from_numpy(x).T[None].contiguous(), torch.from_numpy(w), None, activation="silu")[0].T
    state = np.zeros((C, W - 1), np.float32)
    out = np.zeros((T, C), np.float32)
    _core.ops.causal_conv1d(x, w, state, out, True)
    assert np.abs(out - ref.numpy()).max() < 1e-5
    assert np.array_equal(state, x[-(W - 1):].T)  # the state holds the last W - 1 inputs
    # decode: one more token through the state, against HF's state-update form
    x1 = r.standard_normal((1, C)).astype(np.float32)
    ref_state = torch.from_numpy(np.ascontiguousarray(state))[None].clone()
    ref1 = qn.causal_conv1d_update(torch.from_numpy(x1).T[None].contiguous(), ref_state, torch.from_numpy(w), None, "silu")
    out1 = np.zeros((1, C), np.float32)
    _core.ops.causal_conv1d(x1, w, state, out1, True)
    assert np.abs(out1 - ref1[0].T.numpy()).max() < 1e-5
    assert np.abs(state - ref_state[0].numpy()).max() == 0


def test_norms_against_transformers():
    r = np.random.default_rng(1)
    x = r.standard_normal((7, 3, 32)).astype(np.float32)
    z = r.standard_normal((7, 3, 32)).astype(np.float32)
    w = r.standard_normal(32).astype(np.float32)
    norm = qn.Qwen3NextRMSNormGated(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        ref = norm(torch.from_numpy(x), torch.from_numpy(z)).numpy()
    out = np.zeros_like(x)
    _core.ops.gated_rms_norm(x, z, w, 1e-6, out)
    assert np.abs(out - ref).max() < 1e-5
    # the gates as a column window of a wider per-token row (a fused projection), no copy
    wide = r.standard_normal((7, 20 + 96 + 13)).astype(np.float32)
    wide[:, 20:116] = z.reshape(7, 96)
    out2 = np.zeros_like(x)
    _core.ops.gated_rms_norm(x, wide, w, 1e-6, out2, gate_column=20)
    assert np.abs(out2 - ref).max() < 1e-5
    y = x.copy()
    _core.ops.l2_norm(y, 32, 1e-6)
    assert np.abs(y - qn.l2norm(torch.from_numpy(x), dim=-1, eps=1e-6).numpy()).max() < 1e-6
