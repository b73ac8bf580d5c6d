"""The real server on 127.0.0.1 with the demo model, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest

from server_fixture import ServerProcess

KEY = "test-key"
MAX_LEN = 512


@pytest.fixture(scope="module")
def server(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--api-key", KEY,
                        "--max-model-len", str(MAX_LEN), "--kv-cache-memory-bytes", str(64 << 20),
                        "--sse-keepalive-s", "0.002")
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log  # invalid requests log one line, never a traceback


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


MSG = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_health_version(server, client):
    assert [m.id for m in client.models.list().data][0] == "smol"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert "version" in httpx.get(server.url + "/version").json()


def test_chat_non_streaming_and_usage(server, client):
    r = client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=32)
    c = r.choices[0]
    assert "Paris" in c.message.content and c.finish_reason == "stop"
    tok = httpx.post(server.url + "/tokenize", json={"messages": MSG}, headers={"Authorization": f"Bearer {KEY}"}).json()
    assert r.usage.prompt_tokens == tok["count"]
    n_content = len(httpx.post(server.url + "/tokenize", json={"prompt": c.message.content, "add_special_tokens": False},
                               headers={"Authorization": f"Bearer {KEY}"}).json()["tokens"])
    assert r.usage.completion_tokens == n_content + 1  # + the end-of-turn token
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_equals_non_streaming(client):
    full = client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=24).choices[0].message.content
    chunks = list(client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=24, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_completions_streaming_and_not(client):
    a = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=12)
    b = list(client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=12, stream=True))
    assert a.choices[0].text == "".join(ch.choices[0].text for ch in b if ch.choices)
    assert a.choices[0].finish_reason == "length" and a.usage.completion_tokens == 12


def test_n_and_seed(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Tell me a word."}], temperature=1.0, max_tokens=16)
    r1 = client.chat.completions.create(n=2, seed=42, **kw)
    r2 = client.chat.completions.create(n=2, seed=42, **kw)
    assert len(r1.choices) == 2
    assert [c.message.content for c in r1.choices] == [c.message.content for c in r2.choices]
    r3 = client.chat.completions.create(n=1, seed=7, **kw)
    r4 = client.chat.completions.create(n=1, seed=8, **kw)
    assert r3.choices[0].message.content != r4.choices[0].message.content or r1.choices[0].message.content != r1.choices[1].message.content


def test_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.logprob == pytest.approx(max(t.logprob for t in item.top_logprobs), abs=1e-5)  # greedy pick
    c = client.completions.create(model="smol", prompt="Hello", temperature=0, max_tokens=4, logprobs=2)
    assert len(c.choices[0].logprobs.tokens) == 4 and all(len(t) == 2 for t in c.choices[0].logprobs.top_logprobs)


def test_stop_and_length(client):
    full = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=16).choices[0].text
    assert "." in full
    r = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=16, stop=["."])
    assert r.choices[0].text == full[: full.index(".")] and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_completion_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def error_of(server, path, body, headers=None):
    h = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    r = httpx.post(server.url + path, json=body, headers=h)
    return r.status_code, r.json()


def test_protocol_details(server, client):
    """Cached prompt tokens are reported; an EOS stop has stop_reason null (a stop_token_ids stop: the
    id); a malformed body is a 400 that says so."""
    long = [{"role": "user", "content": "Tell me about the history of Paris, from Roman times to today. " * 3}]
    first = client.chat.completions.create(model="smol", messages=long, max_tokens=2)
    again = client.chat.completions.create(model="smol", messages=long, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 48 > first.usage.prompt_tokens_details.cached_tokens
    r = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] is None
    eos = r.choices[0].text  # stop on the token after it instead, through stop_token_ids
    ids = httpx.post(server.url + "/tokenize", json={"prompt": eos, "add_special_tokens": False},
                     headers={"Authorization": f"Bearer {KEY}"}).json()["tokens"]
    r = client.completions.create(model="smol", prompt="The capital of France is", temperature=0, max_tokens=40,
                                  extra_body={"stop_token_ids": [ids[1]]})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == ids[1]
    # echo + logprobs carry the prompt's tokens (the first without a logprob), as prompt_logprobs has them
    prompt = "The capital of France is"
    r = client.completions.create(model="smol", prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    lp, pl = r.choices[0].logprobs, r.choices[0].model_extra["prompt_logprobs"]
    n = len(pl)
    assert n >= 5 and pl[0] is None and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens[:n]) == prompt and r.choices[0].text.startswith(prompt)
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}, headers={"Authorization": f"Bearer {KEY}"}).json()["tokens"]
    for i in range(1, n):
        assert lp.token_logprobs[i] == pl[i][str(ids[i])]["logprob"] < 0
    assert len(lp.tokens) == n + 3 and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    chunks = list(client.completions.create(model="smol", prompt=prompt, max_tokens=3, echo=True, logprobs=2,
                                            temperature=0, stream=True))
    head = chunks[0].choices[0]
    assert head.text == prompt and "".join(head.logprobs.tokens) == prompt and head.logprobs.token_logprobs[0] is None
    assert head.logprobs.token_logprobs[1:] == lp.token_logprobs[1:n]
    bad = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": "smol", "messages": [',
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    err = bad.json()["error"]
    assert bad.status_code == 400 and err["message"].startswith("the request body is not valid JSON") and err["param"] is None


def test_errors(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSG, temperature=-1)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt="word " * (MAX_LEN + 10), max_tokens=4)
    assert "maximum context length" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MSG)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    status, body = error_of(server, "/v1/chat/completions", {"messages": MSG}, headers={"Authorization": ""})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, body = error_of(server, "/v1/chat/completions", {"messages": MSG, "top_p": 3})
    assert status == 400 and set(body["error"]) >= {"message", "type", "param", "code"}
    status, body = error_of(server, "/v1/chat/completions", {"messages": []})
    assert status == 400
    # still serving
    assert client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=2).choices[0].message.content


def test_eight_concurrent_streams(server):
    async def one(c, i):
        text, finish = "", None
        stream = await c.chat.completions.create(model="smol", messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                                                 temperature=0, max_tokens=20, stream=True)
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return text, finish

    async def main():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        return await asyncio.gather(*(one(c, i) for i in range(8)))

    results = asyncio.run(main())
    assert len(results) == 8 and all(t and f in ("stop", "length") for t, f in results)


def test_keepalive_comments_are_sent(server):
    lines = []
    with httpx.stream("POST", server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "Once upon a time", "max_tokens": 8, "stream": True}) as r:
        for line in r.iter_lines():
            lines.append(line)
    assert any(l.startswith(": keep-alive") for l in lines)
    assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"


def test_disconnect_frees_blocks(server):
    with httpx.stream("POST", server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "Write a long story.", "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    break  # leave mid-stream
    # The stream's generator aborts the request when the response ends (server/streaming.py); the
    # abort is counted then, so wait for it too (a request that ran out its tokens first is not one).
    aborted = 'revolta:request_success_total{finished_reason="abort"}'
    deadline = time.time() + 15
    m = metrics(server)
    while time.time() < deadline and (m["revolta:num_requests_running"] or m["revolta:kv_cache_usage_perc"] or aborted not in m):
        time.sleep(0.1)
        m = metrics(server)
    assert m["revolta:num_requests_running"] == 0
    assert m["revolta:kv_cache_usage_perc"] == 0.0
    assert m.get(aborted, 0) >= 1


def test_metrics_exposed(server, client):
    client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=4)
    client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=4)  # a prefix-cache hit
    m = metrics(server)
    assert m["revolta:generation_tokens_total"] > 0 and m["revolta:prompt_tokens_total"] > 0
    assert m["revolta:time_to_first_token_seconds_count"] > 0
    assert m["revolta:inter_token_latency_seconds_count"] > 0
    assert m["revolta:prefix_cache_hits"] > 0 and 0 < m["revolta:prefix_cache_hit_rate"] <= 1


def test_tokenize_detokenize_round_trip(server):
    h = {"Authorization": f"Bearer {KEY}"}
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "Hello, world!"}, headers=h).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}, headers=h).json()["prompt"] == "Hello, world!"
    r = httpx.post(server.url + "/detokenize", json={"tokens": [10**9]}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0}}}


def test_structured_output_response_format_and_guided_extras(client):
    import jsonschema

    ask = [{"role": "user", "content": "Describe a person."}]
    for seed in range(3):
        r = client.chat.completions.create(model="smol", messages=ask, temperature=1.0, seed=seed, max_tokens=80,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r = client.chat.completions.create(model="smol", messages=ask, temperature=0, max_tokens=80,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(model="smol", messages=MSG, temperature=1.0, max_tokens=8,
                                       extra_body={"guided_choice": ["Paris", "Lyon"]})
    assert r.choices[0].message.content in ("Paris", "Lyon")
    stream = client.chat.completions.create(model="smol", messages=ask, temperature=1.0, seed=5, max_tokens=80, stream=True,
                                            extra_body={"guided_json": PERSON})
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)), PERSON)
    r = client.completions.create(model="smol", prompt="Code:", max_tokens=12, extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"})
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", r.choices[0].text)
    resp = client.responses.create(model="smol", input="Describe a person.", max_output_tokens=80,
                                   text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(resp.output_text), PERSON)


def test_structured_output_errors_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSG, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert e.value.body["param"] == "response_format" and "nonsense" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSG, max_tokens=8, response_format={"type": "xml"})
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSG, max_tokens=8, extra_body={"guided_regex": "(open"})
    assert e.value.body["param"] == "guided_regex"
    assert client.chat.completions.create(model="smol", messages=MSG, temperature=0, max_tokens=4).choices[0].message.content


SYSTEM = "You are a careful assistant who answers questions about geography in one short sentence. " * 4


def billing_line(cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch={cch};"


def test_billing_header_line_leaves_the_prefix_cached(client):
    """Claude Code's first system line changes every request: it is not templated, so two requests
    that differ only there share their prefix (and count as the request without it)."""
    plain = client.chat.completions.create(model="smol", messages=[{"role": "system", "content": SYSTEM}] + MSG,
                                           temperature=0, max_tokens=1).usage
    usage = []
    for cch in ("eb6c6", "0aaa9"):
        messages = [{"role": "system", "content": billing_line(cch) + "\n" + SYSTEM}] + MSG
        usage.append(client.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=1).usage)
    assert usage[0].prompt_tokens == usage[1].prompt_tokens == plain.prompt_tokens
    assert usage[1].prompt_tokens_details.cached_tokens >= 64
    tokenized = httpx.post(str(client.base_url).removesuffix("/v1/") + "/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                           json={"messages": [{"role": "system", "content": billing_line("x1") + "\n" + SYSTEM}] + MSG})
    assert tokenized.json()["count"] == plain.prompt_tokens  # /tokenize renders as the chat endpoint does


def test_errors_name_the_real_problem(server):
    """A non-finite number is not 'above 2', and two guided_* fields name the first of them."""
    r = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}",
                   "Content-Type": "application/json"},
                   content='{"model": "smol", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert "finite number" in r.json()["error"]["message"]
    status, body = error_of(server, "/v1/chat/completions", {"messages": MSG, "guided_json": {"type": "object"},
                                                             "guided_regex": "a+"})
    assert status == 400 and body["error"]["param"] == "guided_json"
    assert "guided_json and guided_regex exclude each other" in body["error"]["message"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_forced_tool_calls_need_no_parser(client):
    """This server has no --tool-call-parser: a forced call (required, or a named function) is held
    to the default call format by its grammar and read back in it; every sampled response at
    temperature 1 is a valid call. tool_choice auto cannot be read without a parser: a 400 naming
    the flag."""
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    for seed in range(8):
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            r = client.chat.completions.create(model="smol", messages=ask, tools=[WEATHER, TIME], tool_choice=choice,
                                               temperature=1.0, seed=seed, max_tokens=96, parallel_tool_calls=False)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
            call = c.message.tool_calls[0].function
            assert call.name in (("get_weather", "get_time") if choice == "required" else ("get_time",))
            assert isinstance(json.loads(call.arguments)["city"], str)
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        client.chat.completions.create(model="smol", messages=ask, tools=[WEATHER], max_tokens=8)


def test_fields_not_honoured_are_refused(server, client):
    """suffix would change the answer, and best_of below n is impossible: a 400 naming each, never
    ignored; their neutral values pass."""
    for path, body, param in (("/v1/completions", {"prompt": "Hi", "n": 2, "best_of": 1}, "best_of"),
                              ("/v1/completions", {"prompt": "Hi", "suffix": " end."}, "suffix")):
        status, err = error_of(server, path, {"model": "smol", "max_tokens": 2, **body})
        assert status == 400 and err["error"]["param"] == param, err
    r = client.completions.create(model="smol", prompt="Hi", max_tokens=2, best_of=1, logit_bias={}, suffix="")
    assert r.choices[0].text is not None


def test_logit_bias_is_honoured_and_bounded(server, client):
    """logit_bias (token id -> [-100, 100]) moves the sampled tokens on both endpoints; a key that is
    no token id, a bias out of range or a token past the vocabulary is a 400 naming the field."""
    r = client.chat.completions.create(model="smol", messages=MSG, max_tokens=3, temperature=1.0, seed=3,
                                       logit_bias={"1234": 100})
    assert r.choices[0].message.content == client_tokens_text(server, [1234] * 3)
    r = client.completions.create(model="smol", prompt="Hi", max_tokens=2, temperature=0, logit_bias={"1234": 100})
    assert r.choices[0].text == client_tokens_text(server, [1234] * 2)
    for bias in ({"x": 1}, {"-3": 1}, {"42": 100.5}, {"42": "NaN"}, {"99999999": 1}, {str(i): 1 for i in range(1025)}):
        status, err = error_of(server, "/v1/chat/completions", {"model": "smol", "messages": MSG, "max_tokens": 2,
                                                                "logit_bias": bias})
        assert status == 400 and err["error"]["param"].startswith("logit_bias"), (bias, err)


def client_tokens_text(server, ids):
    r = httpx.post(server.url + "/detokenize", json={"model": "smol", "tokens": ids}, headers={"Authorization": f"Bearer {KEY}"})
    return r.json()["prompt"]


def test_render_gives_the_prompt_a_chat_request_runs(server, client):
    """/v1/chat/completions/render (vLLM's): the conversation as templated and the engine prompt, the
    same tokens the chat request then counts; nothing is generated."""
    messages = [{"role": "system", "content": billing_line("abc12") + "\n" + SYSTEM}] + MSG
    r = httpx.post(server.url + "/v1/chat/completions/render", json={"model": "smol", "messages": messages},
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    conversation, (prompt,) = r.json()
    assert conversation[0] == {"role": "system", "content": SYSTEM} and conversation[1] == MSG[0]
    assert MSG[0]["content"] in prompt["prompt"] and "billing" not in prompt["prompt"]
    used = client.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=1).usage
    assert used.prompt_tokens == len(prompt["prompt_token_ids"])
    status, body = error_of(server, "/v1/chat/completions/render", {"model": "other", "messages": MSG})
    assert status == 404


def test_chat_template_override(demo_model_dir, tmp_path):
    """--chat-template FILE renders chats instead of the model's own template."""
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    srv = ServerProcess("--model", demo_model_dir, "--max-model-len", "256", "--kv-cache-memory-bytes", str(16 << 20),
                        "--chat-template", str(template))
    try:
        r = httpx.post(srv.url + "/v1/chat/completions/render", json={"messages": MSG})
        assert r.json()[1][0]["prompt"] == f"[user] {MSG[0]['content']}\n[assistant] "
    finally:
        assert "Traceback" not in srv.stop()


def test_best_of_returns_the_likeliest_samples(server, client):
    """best_of=4, n=2: the two of the four seeded samples with the highest summed log-probability (the
    same four that n=4 gives), best first; streaming it is a 400."""
    body = dict(model="smol", prompt="The ocean is", max_tokens=6, temperature=1.0, seed=11)
    four = client.completions.create(n=4, logprobs=0, **body).choices
    sums = {c.text: sum(c.logprobs.token_logprobs) for c in four}
    best = client.completions.create(n=2, best_of=4, **body)
    assert [c.text for c in best.choices] == sorted(sums, key=lambda t: -sums[t])[:2]
    assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None
    status, err = error_of(server, "/v1/completions", {**body, "n": 1, "best_of": 2, "stream": True})
    assert status == 400 and err["error"]["param"] == "best_of"
    status, err = error_of(server, "/v1/chat/completions", {"model": "smol", "messages": MSG, "best_of": 2})
    assert status == 400 and err["error"]["param"] == "best_of"


def test_beam_search_gives_the_offline_beams(server, demo_model_dir):
    """use_beam_search (vLLM's): the n best beams, the ones LLM.beam_search finds for the same prompt."""
    from revolta import LLM, BeamSearchParams

    r = httpx.post(server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "smol", "prompt": "The ocean is", "max_tokens": 5, "n": 3, "use_beam_search": True})
    assert r.status_code == 200, r.text
    got = r.json()["choices"]
    with LLM(max_model_len=256) as llm:
        (want,) = llm.beam_search(["The ocean is"], BeamSearchParams(beam_width=3, max_tokens=5))
        ids = llm.get_tokenizer().encode("The ocean is")
        texts = [llm.get_tokenizer().decode(s.tokens[len(ids):]) for s in want.sequences]
    assert [c["text"] for c in got] == texts
    assert all(abs(c["cumulative_logprob"] - s.cum_logprob) < 1e-3 for c, s in zip(got, want.sequences))
    for extra in ({"stream": True}, {"temperature": 0.8}, {"logprobs": 1}, {"n": 11}):
        status, err = error_of(server, "/v1/completions", {"model": "smol", "prompt": "Hi", "max_tokens": 2, "n": 2,
                                                           "use_beam_search": True, **extra})
        assert status == 400, (extra, err)
