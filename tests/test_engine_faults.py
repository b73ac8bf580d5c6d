"""Failures in the engine, on the CPU and the GPU (`pytest -m gpu` runs the cuda cases, with
async scheduling and decode graphs on): a step that throws fails only its requests and the
engine's later output is unchanged; a device error is fatal for every request and for
await_outputs. REVOLTA_FAULT_INJECT makes the failures."""

from __future__ import annotations

import pytest

from conftest import make_hf_model

FAULT = 200  # a token id the other prompts never hold


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama_faults")
    make_hf_model("llama", d, seed=5, max_position_embeddings=512)
    return str(d)


def engine(model_dir, device, monkeypatch, fault: str):
    from revolta import _core

    monkeypatch.setenv("REVOLTA_FAULT_INJECT", fault)  # read when the engine is made
    cfg = _core.EngineConfig()
    cfg.model = model_dir
    cfg.device = device
    cfg.max_model_len = 512
    cfg.gpu_memory_utilization = 0.0
    cfg.async_scheduling = "on"
    cfg.kv_cache_memory_bytes = 64 << 20
    return _core.Engine(cfg)


def run(e, prompts, max_tokens=24):
    """Greedy requests to their ends: {prompt index: (tokens, finish_reason, error)}."""
    from revolta import _core

    p = _core.SamplingParams()
    p.temperature = 0.0
    p.max_tokens = max_tokens
    p.ignore_eos = True
    ids = {e.add_request(list(x), p): i for i, x in enumerate(prompts)}
    out = {i: ([], None, "") for i in ids.values()}
    while any(v[1] is None for v in out.values()):
        for o in e.await_outputs(1000):
            i = ids[o.request_id]
            toks, _, _ = out[i]
            toks += [t.token for t in o.tokens]
            if o.finished:
                out[i] = (toks, o.finish_reason, o.error)
    return out


def test_failing_step_fails_only_its_requests(model_dir, device, monkeypatch):
    good = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [3, 4]]
    reference = run(ref := engine(model_dir, device, monkeypatch, ""), good)
    ref.shutdown()
    e = engine(model_dir, device, monkeypatch, f"step:{FAULT}")
    try:
        bad = run(e, [[5, FAULT, 7]])
        assert bad[0][1] == "error" and "injected step fault" in bad[0][2]
        after = run(e, good)  # batched decode (graphs, async scheduling) as before the failure
        assert {i: v[0] for i, v in after.items()} == {i: v[0] for i, v in reference.items()}
        assert all(v[1] == "length" for v in after.values())
        s = e.stats()
        assert s.num_running == 0 and s.num_blocks_used == 0
    finally:
        e.shutdown()


def test_device_error_is_fatal(model_dir, device, monkeypatch):
    e = engine(model_dir, device, monkeypatch, f"device:{FAULT}")
    try:
        out = run(e, [[5, 6, 7], [5, FAULT, 7]], max_tokens=200)
        assert all(v[1] == "error" and "injected device fault" in v[2] for v in out.values())
        with pytest.raises(RuntimeError, match="fatal error: injected device fault"):
            e.await_outputs(100)
    finally:
        e.shutdown()
