"""Hostile request bodies against every POST endpoint: never a 5xx, and every error in its API's shape.

The app runs in process over a real engine: a tiny random Llama that shares the demo model's
tokenizer and chat template (so prompts tokenize as in serving, and generation is fast). Bodies
are valid seeds mutated by hypothesis: a field, named by the server's own OpenAPI document or
already in the body, is replaced by a value a careless or hostile client might send, or removed.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_hf_model

STREAMING = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
SEEDS = {
    "/v1/chat/completions": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                             "logit_bias": {"5": 1.5}},
    "/v1/completions": {"model": "m", "max_tokens": 4, "prompt": "The sky is", "logit_bias": {"7": -100}, "best_of": 2},
    "/v1/responses": {"model": "m", "max_output_tokens": 4, "input": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    "/v1/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/chat/completions/render": {"model": "m", "messages": [{"role": "system", "content": "x-anthropic-billing-header: a\nb"},
                                                               {"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"model": "m", "input": ["hello", "sea"], "encoding_format": "float"},
    "/pooling": {"model": "m", "input": [[1, 2, 3]]},
    "/score": {"model": "m", "text_1": "a cat", "text_2": ["a dog", "stocks"]},
    "/rerank": {"model": "m", "query": "a cat", "documents": ["a dog", "stocks"], "top_n": 1},
    "/tokenize": {"prompt": "hello"},
    "/detokenize": {"tokens": [1, 2, 3]},
}

# Values from the list of inputs that once gave a 500, and their relatives.
HOSTILE = st.one_of(
    st.sampled_from(["\ud800", "a\udfffb", "", " ", "10", "yes", "true", "null", "\x00", "m", "user", "tool_use",
                     "function_call", "robot", "text", "image", "message", "reasoning", "auto", "any", "required"]),
    st.sampled_from([-1, 0, 1, 2, 16, 17, 255, 2**31 - 1, 2**31, 2**40, 10**12, 2**63, -(2**63), 10**30]),
    st.sampled_from([float("nan"), float("inf"), -0.0, 0.5, 1.5, 1e308, -2.5]),
    st.booleans(),
    st.none(),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=8)),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=8,
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "function_call",
                                                    "function_call_output", "message", "reasoning", "input_text", "x"])},
                          optional={"text": st.just("\ud800"), "id": st.integers(), "name": st.none(), "input": st.just([]),
                                    "role": st.just("robot"), "content": st.just([1]), "call_id": st.none(),
                                    "tool_use_id": st.just(7), "arguments": st.just({}), "output": st.just(3)}),
)


def schema_fields(app) -> list[str]:
    """Every property name in the OpenAPI document's request schemas."""
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.get("properties", {}).items():
                names.add(k)
                walk(v)
            for v in node.values():
                if isinstance(v, (dict, list)):
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(app.openapi().get("components", {}).get("schemas", {}))
    return sorted(names)


def containers(body, path=()):
    """(path, container) for the body and every dict / list inside it."""
    yield path, body
    items = body.items() if isinstance(body, dict) else enumerate(body)
    for k, v in items:
        if isinstance(v, (dict, list)):
            yield from containers(v, path + (k,))


@st.composite
def mutated(draw, endpoint: str, fields: list[str]):
    body = json.loads(json.dumps(SEEDS[endpoint]))
    for _ in range(draw(st.integers(1, 3))):
        spots = list(containers(body))
        _, target = draw(st.sampled_from(spots))
        if isinstance(target, dict):
            key = draw(st.one_of(st.sampled_from(sorted(target) or ["model"]), st.sampled_from(fields)))
            if key in target and draw(st.integers(0, 5)) == 0:
                del target[key]
            else:
                target[key] = copy.deepcopy(draw(HOSTILE))  # st.just() hands out one shared object
        elif target:
            target[draw(st.integers(0, len(target) - 1))] = copy.deepcopy(draw(HOSTILE))
        else:
            target.append(copy.deepcopy(draw(HOSTILE)))
    return body


def check_error_shape(endpoint: str, r) -> None:
    body = r.json()
    if endpoint.startswith("/v1/messages"):
        assert body["type"] == "error" and isinstance(body["error"]["message"], str) and body["error"]["type"], body
    else:
        err = body["error"]
        assert isinstance(err["message"], str) and err["type"] and "param" in err and err["code"] is not None, body


def check_stream(endpoint: str, text: str) -> None:
    if endpoint.startswith("/v1/messages"):
        assert "event: message_stop" in text or "event: error" in text, text[-300:]
    elif endpoint == "/v1/responses":
        assert any(f"event: {e}" in text for e in ("response.completed", "response.incomplete", "error")), text[-300:]
    else:
        assert text.rstrip().endswith("data: [DONE]"), text[-300:]


@pytest.fixture(scope="module")
def client(tmp_path_factory, demo_model_dir):
    from revolta import _core
    from revolta.config import ServerOptions
    from revolta.models.tokenizer import Tokenizer
    from revolta.server.app import create_app
    from revolta.server.async_engine import AsyncEngine

    d = tmp_path_factory.mktemp("fuzz_model")
    tok = Tokenizer(demo_model_dir)
    make_hf_model("llama", d, vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{demo_model_dir}/{name}", d / name)
    cfg = _core.EngineConfig()
    cfg.model = str(d)
    cfg.max_model_len = 128
    cfg.max_num_seqs = 8
    cfg.kv_cache_memory_bytes = 8 << 20
    engine = AsyncEngine(_core.Engine(cfg), cfg.max_num_seqs)
    app = create_app(engine, Tokenizer(d), ["m"], ServerOptions(tool_call_parser="hermes", max_waiting_requests=64))
    with TestClient(app, raise_server_exceptions=False) as c:
        c.fields = schema_fields(app)
        c.engine = engine
        yield c
    engine.shutdown()


@pytest.mark.parametrize("endpoint", sorted(SEEDS))
def test_seeds_are_accepted(client, endpoint):
    r = client.post(endpoint, json=SEEDS[endpoint])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("endpoint", sorted(SEEDS))
def test_hostile_bodies_never_5xx(client, endpoint):
    @settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=mutated(endpoint, client.fields))
    def run(body):
        payload = json.dumps(body, allow_nan=True)
        r = client.post(endpoint, content=payload, headers={"content-type": "application/json"})
        assert r.status_code < 500, (payload, r.status_code, r.text)
        if r.status_code >= 400:
            check_error_shape(endpoint, r)
        elif body.get("stream") is True and endpoint in STREAMING:  # elsewhere an unknown field, ignored
            check_stream(endpoint, r.text)

    run()
    assert client.get("/health").status_code == 200
    stats = client.engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_reported_inputs_get_400(client):
    """The inputs named in the hardening issue, one by one."""
    chat = SEEDS["/v1/chat/completions"]
    cases = [
        ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "\ud800"}]}),
        ("/v1/completions", {**SEEDS["/v1/completions"], "prompt": "x\ud800"}),
        ("/v1/responses", {**SEEDS["/v1/responses"], "input": "\ud800"}),
        ("/v1/messages", {**SEEDS["/v1/messages"], "system": "\ud800"}),
        ("/v1/messages/count_tokens", {**SEEDS["/v1/messages/count_tokens"], "messages": [{"role": "user", "content": "\ud800"}]}),
        ("/v1/chat/completions", {**chat, "top_k": 10**12}),
        ("/v1/chat/completions", {**chat, "stop_token_ids": [2**40]}),
        ("/v1/completions", {**SEEDS["/v1/completions"], "prompt": [-1]}),
        ("/v1/chat/completions", {**chat, "chat_template_kwargs": {"bos_token": "x"}}),
        ("/v1/messages", {**SEEDS["/v1/messages"], "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]}),
        ("/v1/responses", {**SEEDS["/v1/responses"], "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
        ("/v1/responses", {**SEEDS["/v1/responses"], "input": [{"role": "robot", "content": "hi"}]}),
        ("/v1/chat/completions", {**chat, "max_tokens": "10"}),
        ("/v1/chat/completions", {**chat, "max_tokens": True}),
        ("/v1/chat/completions", {**chat, "n": "2"}),
        ("/v1/chat/completions", {**chat, "logprobs": "yes"}),
        ("/v1/chat/completions", {**chat, "stream": "yes"}),
    ]
    for endpoint, body in cases:
        r = client.post(endpoint, content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 400, (body, r.status_code, r.text)
        check_error_shape(endpoint, r)


def test_prompt_of_max_model_len_is_refused(client):
    ids = client.post("/tokenize", json={"prompt": "hi"}).json()["tokens"][:1]
    r = client.post("/v1/completions", json={"model": "m", "prompt": ids * 128})
    assert r.status_code == 400 and "no room" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": "m", "prompt": ids * 127, "max_tokens": 1, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 128
