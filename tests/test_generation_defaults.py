"""Default sampling from the model (generation_config, as vLLM's --generation-config auto): the
fields of generation_config.json become the defaults of requests that leave them out, offline and
on the server; overrides go on top; a request's own values win. The demo model carries its card's
recommended 0.2 / 0.9, at which it answers the README's question for every seed tried, where the API
defaults (1.0 / 1.0) do not."""

from __future__ import annotations

import json

import openai
import pytest

from revolta import LLM, SamplingParams
from revolta.generation_defaults import generation_defaults
from revolta.profiles import load_profile
from conftest import readme_question
from server_fixture import ServerProcess

QUESTION = [{"role": "user", "content": readme_question()}]


def test_defaults_come_from_the_file_with_overrides(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 100, "do_sample": True, "eos_token_id": 2}))
    assert generation_defaults(str(tmp_path)) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 100}
    assert generation_defaults(str(tmp_path), "vllm") == {}
    assert generation_defaults(str(tmp_path), "auto", {"temperature": 0.1})["temperature"] == 0.1
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"min_p": 0.05}))
    assert generation_defaults(str(tmp_path), str(other)) == {"min_p": 0.05}
    with pytest.raises(ValueError, match="override_generation_config: unknown field"):
        generation_defaults(str(tmp_path), "auto", {"temprature": 0.1})
    with pytest.raises(ValueError, match="generation_config: no generation_config.json"):
        generation_defaults(str(tmp_path), str(tmp_path / "missing"))


@pytest.fixture(scope="module")
def llm(demo_model_dir):
    """The demo as the README's `--profile cpu-demo` runs it (its weight dtype)."""
    engine = LLM(demo_model_dir, max_model_len=512, dtype=load_profile("cpu-demo")["dtype"])
    yield engine
    engine.shutdown()


def paris(llm, params: list[SamplingParams]) -> int:
    outs = [llm.chat(QUESTION, p)[0].outputs[0].text for p in params]
    return sum("Paris" in o for o in outs)


def test_the_demo_answers_its_question_at_the_defaults(llm):
    """The README's question, as its curl command sends it (max_tokens 32), to the demo read in
    place: Paris for every seed at the defaults; at the API defaults (1.0 / 1.0) not always."""
    assert llm.default_sampling == {"temperature": 0.2, "top_p": 0.9}
    seeds = range(12)
    at_defaults = paris(llm, [SamplingParams(**{**llm.default_sampling, "seed": s, "max_tokens": 32}) for s in seeds])
    at_api_defaults = paris(llm, [SamplingParams(seed=s, max_tokens=32) for s in seeds])
    assert at_defaults == len(seeds) and at_api_defaults < len(seeds), (at_defaults, at_api_defaults)
    # generate / chat without SamplingParams take the model's defaults
    assert llm.get_default_sampling_params().temperature == 0.2


def test_server_applies_the_defaults_and_the_request_wins(llm, demo_model_dir):
    srv = ServerProcess("--profile", "cpu-demo", "--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(32 << 20))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        for seed in (3, 4):
            served = client.chat.completions.create(model="smol", messages=QUESTION, seed=seed, max_tokens=24)
            offline = llm.chat(QUESTION, SamplingParams(temperature=0.2, top_p=0.9, seed=seed, max_tokens=24))[0]
            assert served.choices[0].message.content == offline.outputs[0].text
            hot = client.chat.completions.create(model="smol", messages=QUESTION, seed=seed, max_tokens=24,
                                                 temperature=1.0, top_p=1.0)
            offline_hot = llm.chat(QUESTION, SamplingParams(temperature=1.0, seed=seed, max_tokens=24))[0]
            assert hot.choices[0].message.content == offline_hot.outputs[0].text
    finally:
        log = srv.stop()
    assert "default sampling (generation_config auto): temperature 0.2, top_p 0.9" in log
