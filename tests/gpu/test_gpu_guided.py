"""Guided decoding on the GPU (`pytest -m gpu`): the grammar's token mask reaches the device sampler
(greedy and temperature 1 rows, beside unconstrained rows in the same batch), so every output of a
tiny random model with a byte-level tokenizer validates against its JSON schema (jsonschema),
matches its regex or is one of its choices."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from conftest import make_hf_model, save_byte_tokenizer

pytestmark = pytest.mark.gpu

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "city": {"enum": ["Oslo", "Paris", "Lima"]}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import revolta

    d = tmp_path_factory.mktemp("guided")
    make_hf_model("llama", d, seed=21, vocab_size=320, hidden_size=128, max_position_embeddings=512)
    save_byte_tokenizer(d)
    engine = revolta.LLM(str(d), device="cuda", gpu_memory_utilization=0.0, max_model_len=512,
                         kv_cache_memory_bytes=64 << 20)
    yield engine
    engine.engine.shutdown()


def test_guided_rows_follow_their_grammars_on_the_gpu(llm):
    import revolta

    code = r"[A-Z][a-z]{2,8}-\d{3}"
    grammars = [  # (guided_decoding, check of the text)
        (dict(json=PERSON, disable_any_whitespace=True), lambda t: jsonschema.validate(json.loads(t), PERSON)),
        (dict(regex=code), lambda t: re.fullmatch(code, t) or pytest.fail(t)),
        (dict(choice=["red", "green", "blue"]), lambda t: t in ("red", "green", "blue") or pytest.fail(t)),
    ]
    cases = [(g, check, temperature, seed) for seed in range(6) for temperature in (0.0, 1.0) for g, check in grammars]
    params = [revolta.SamplingParams(temperature=temperature, seed=seed, max_tokens=120, guided_decoding=g)
              for g, _, temperature, seed in cases]
    free = [revolta.SamplingParams(temperature=1.0, seed=i, max_tokens=40) for i in range(6)]  # unconstrained rows beside
    outs = llm.generate(["Describe a person."] * (len(params) + len(free)), params + free)
    for (g, check, temperature, _), out in zip(cases, outs):
        assert out.outputs[0].finish_reason == "stop", (g, temperature, out.outputs[0].text)
        check(out.outputs[0].text)
    # Without the grammar the same random model does not produce such text.
    unconstrained = [o.outputs[0].text for o in outs[len(params):]]
    assert not any(re.fullmatch(r"[A-Z][a-z]{2,8}-\d{3}", t) for t in unconstrained)
