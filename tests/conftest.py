"""Shared helpers: tiny random HF models (the architecture reference) and an HF greedy loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def make_hf_model(kind: str, out_dir: Path, seed: int = 0, **overrides):
    """Builds a tiny random HF model of `kind` ('llama' or 'qwen3'), saves it, returns it (eval)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.05,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )
    common.update(overrides)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen3":
        common.setdefault("head_dim", common["hidden_size"] // common["num_attention_heads"])
        cfg = transformers.Qwen3Config(**common)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    model = model.float().eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


@torch.no_grad()
def hf_last_logits(model, ids: list[int]):
    return model(torch.tensor([ids])).logits[0, -1].float()


@torch.no_grad()
def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy decoding with the HF model, recomputing the whole sequence each step (no cache
    semantics to trust); ties go to the lower id."""
    seq = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):]


def kv_bytes_per_token(model) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4


@pytest.fixture(scope="session")
def demo_model_dir() -> str:
    import revolta

    return revolta.demo_model()


@pytest.fixture(autouse=True, scope="session")
def _threads():
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="session")
def think_tokenizer(tmp_path_factory, demo_model_dir):
    """The demo tokenizer plus Qwen3's reasoning and tool markers as added tokens, with a ChatML
    template that can switch thinking off (as Qwen3's does)."""
    import json

    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    from revolta.models.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("think_tok")
    hf = HFTokenizer.from_file(f"{demo_model_dir}/tokenizer.json")
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")])
    hf.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))
    return Tokenizer(d)
