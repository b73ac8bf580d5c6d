"""LangChain (langchain-openai, langchain-anthropic) against a real server on the demo model, as an
application would use it: with_structured_output in each of its methods returns objects that
validate, and bind_tools with a forced choice returns tool calls whose arguments validate
(jsonschema), through both the OpenAI and the Anthropic API."""

from __future__ import annotations

import jsonschema
import langchain_anthropic
import langchain_openai
import pytest
from pydantic import BaseModel, Field

from server_fixture import ServerProcess


class City(BaseModel):
    """A city and the country it lies in."""

    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=40)


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                                  "parameters": WEATHER}}
ASK_CITY = "Name a large European city."
ASK_WEATHER = "What's the weather in Oslo for the next 3 days?"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(64 << 20), "--tool-call-parser", "hermes")
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def chat_openai(server):
    return langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="x", model="smol", temperature=1.0,
                                       max_tokens=120, max_retries=0, seed=1)


@pytest.fixture(scope="module")
def chat_anthropic(server):
    return langchain_anthropic.ChatAnthropic(base_url=server.url, api_key="x", model="smol", temperature=1.0,
                                             max_tokens=120, max_retries=0)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_openai_structured_output_as_pydantic(chat_openai, method):
    """Eight sampled responses per method (sixteen in all, temperature 1, a seed each)."""
    for seed in range(8):
        llm = chat_openai.model_copy(update={"seed": seed, "max_tokens": 320})  # (room for indentation runs)
        city = llm.with_structured_output(City, method=method).invoke(ASK_CITY)
        assert isinstance(city, City), (seed, city)  # LangChain validated it against the model class
        assert len(city.name) <= 24 and 0 <= city.population_millions <= 40


def test_openai_structured_output_json_mode(chat_openai):
    raw = chat_openai.with_structured_output(None, method="json_mode", include_raw=True).invoke(
        ASK_CITY + " Answer in JSON.")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], dict), raw["raw"].content


def test_openai_bind_tools_forced(chat_openai):
    """Sixteen sampled responses (temperature 1, a seed each), forced both ways: every one a single
    call whose arguments validate."""
    for seed in range(8):
        for choice in ("required", "get_weather"):
            bound = chat_openai.bind_tools([WEATHER_TOOL], tool_choice=choice, parallel_tool_calls=False).bind(seed=seed)
            msg = bound.invoke(ASK_WEATHER)
            assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] == "get_weather", (seed, msg)
            jsonschema.validate(msg.tool_calls[0]["args"], WEATHER)


def test_anthropic_structured_output_and_tools(chat_anthropic):
    city = chat_anthropic.with_structured_output(City).invoke(ASK_CITY)
    assert isinstance(city, City)
    for _ in range(8):  # sixteen sampled responses (temperature 1), forced both ways
        for choice in ("any", "get_weather"):
            msg = chat_anthropic.bind_tools([WEATHER_TOOL], tool_choice=choice).invoke(ASK_WEATHER)
            assert msg.tool_calls and all(c["name"] == "get_weather" for c in msg.tool_calls), msg
            finished = msg.tool_calls if msg.response_metadata.get("stop_reason") == "tool_use" else msg.tool_calls[:-1]
            for c in finished:  # (parallel calls allowed: the last may be cut by max_tokens)
                jsonschema.validate(c["args"], WEATHER)
