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


def test_logit_bias_and_the_reasoning_gate_on_the_gpu(llm):
    """logit_bias reaches the device sampler (greedy and sampled rows), and a grammar gated on an
    end-of-reasoning token leaves the tokens before it to the model, as on the CPU."""
    import revolta
    from revolta.guided import ReasoningGate

    prompt = [5, 17, 99, 3, 42]
    outs = llm.generate([prompt] * 4, [revolta.SamplingParams(temperature=t, seed=s, max_tokens=4, logit_bias={77: 100.0})
                                       for t, s in ((0.0, 0), (1.0, 1), (1.0, 2), (0.7, 3))])
    assert all(o.outputs[0].token_ids == [77] * 4 for o in outs)
    free = llm.generate(prompt, revolta.SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    end = free[3]
    cut = free.index(end) + 1
    gated = llm.generate(prompt, revolta.SamplingParams(
        temperature=0, max_tokens=40, guided_decoding={"regex": "[0-9]{3}"},
        guided_after=ReasoningGate(start=None, end=end, in_reasoning=True)))[0].outputs[0]
    assert gated.token_ids[:cut] == free[:cut] and re.fullmatch("[0-9]{3}", llm.tokenizer.decode(gated.token_ids[cut:]))


def test_embeddings_on_the_gpu_match_the_cpu(tmp_path):
    """Pooling requests on the GPU (eager steps returning every row's hidden state): the CPU's
    vectors (within fp16), last token and mean, under chunked prefill."""
    import json as _json

    import torch

    import revolta

    make_hf_model("qwen3", tmp_path, seed=8, vocab_size=320, max_position_embeddings=512)
    prompts = [list(range(3, 40)), [9, 8, 7, 6, 5], list(range(100, 230))]
    vectors = {}
    for mode in ("last", "mean"):
        flags = {"pooling_mode_mean_tokens": mode == "mean", "pooling_mode_lasttoken": mode == "last"}
        (tmp_path / "1_Pooling").mkdir(exist_ok=True)
        (tmp_path / "1_Pooling" / "config.json").write_text(_json.dumps(flags))
        (tmp_path / "modules.json").write_text(_json.dumps([{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        for device in ("cpu", "cuda"):
            extra = {"gpu_memory_utilization": 0.0, "kv_cache_memory_bytes": 64 << 20} if device == "cuda" else {}
            with revolta.LLM(str(tmp_path), device=device, max_model_len=256, max_num_batched_tokens=48, **extra) as e:
                vectors[mode, device] = [torch.tensor(o.outputs.embedding) for o in e.embed(prompts)]
        for a, b in zip(vectors[mode, "cpu"], vectors[mode, "cuda"]):  # (fp16 on the GPU)
            assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.999, mode
            assert abs(float(a.norm() / b.norm()) - 1) < 0.01, mode
