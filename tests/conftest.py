"""Shared helpers: tiny random HF models (the architecture reference) and an HF greedy loop."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
}


def make_hf_model(kind: str, out_dir: Path, seed: int = 0, **overrides):
    """Builds a tiny random HF model of `kind`, saves it, returns it (eval, float32).

    Norm weights and DeltaNet time-step biases are perturbed: their default initialisations
    (ones, or zeros for (1 + w) norms) would let a wrong norm formula pass unnoticed."""
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
    if kind in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        common["head_dim"] = overrides.get("head_dim", common["hidden_size"] // overrides.get("num_attention_heads", 4))
    if kind == "qwen3_5_moe":
        common.pop("intermediate_size")
    common.update(overrides)
    config_name, model_name = HF_CLASSES[kind]
    if kind == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe

        cfg = getattr(configuration_qwen3_5_moe, config_name)(**common)
    else:
        cfg = getattr(transformers, config_name)(**common)
    model = getattr(transformers, model_name)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def save_byte_tokenizer(out_dir: Path, vocab_size: int = 300) -> None:
    """A byte-level BPE tokenizer.json for a tiny random model (ids 0-2: <unk>, <s>, </s>, as
    make_hf_model's bos/eos): every string has a tokenization, so any grammar can be followed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['{"name": "Ann", "age": 31, "city": "Oslo"}', "yes no maybe 42"] * 10, trainer)
    tok.save(str(Path(out_dir) / "tokenizer.json"))


def first_divergence_on_near_tie(cpu_ids, gpu_ids, cpu_logits, near_tie: float) -> bool:
    """GPU greedy tokens equal the CPU's up to the first divergence, which must sit where the CPU's
    top-2 logits differ by less than near_tie. True when the two diverged (the rest is not compared)."""
    import numpy as np

    for i, (x, y) in enumerate(zip(cpu_ids, gpu_ids)):
        if x != y:
            top2 = np.sort(np.asarray(cpu_logits[i]))[-2:]
            margin = float(top2[1] - top2[0])
            assert margin < near_tie, f"GPU diverged at token {i} ({y} vs {x}) where the CPU margin is {margin:.4f}"
            return True
    return False


def greedy(max_tokens: int, logits: bool = False):
    """Greedy sampling of exactly max_tokens tokens (the GPU-vs-CPU comparisons)."""
    import revolta

    return revolta.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, return_generation_logits=logits)


def assert_greedy_until_near_tie(cpu_out, gpu_out, near_tie: float, length: int) -> None:
    """The GPU's greedy tokens are the CPU's, all `length` of them, unless they part at a CPU near-tie."""
    a, b = cpu_out.outputs[0].token_ids, gpu_out.outputs[0].token_ids
    if not first_divergence_on_near_tie(a, b, cpu_out.outputs[0].generation_logits, near_tie):
        assert len(a) == len(b) == length


def state_bytes_per_slot(model) -> int:
    """Recurrent-state bytes of one request (conv + delta-rule state of every DeltaNet layer)."""
    c = model.config
    n = sum(t == "linear_attention" for t in (getattr(c, "layer_types", None) or []))
    if not n:
        return 0
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    per_layer = conv_dim * (c.linear_conv_kernel_dim - 1) + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    return n * per_layer * 4


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
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    return 2 * sum(t == "full_attention" for t in types) * c.num_key_value_heads * head_dim * 4


def readme_question() -> str:
    """The question the README's first request asks the demo server."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.search(r'"role": "user", "content": "([^"]+)"', text).group(1)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    """A tiny random Llama checkpoint (make_hf_model), made once per test session."""
    d = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", d)
    return str(d)


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


# Qwen3.5's way: with thinking on, the generation prompt itself opens the reasoning block.
THINKING_CHATML = CHATML.replace("<think>\n\n</think>\n\n{% endif %}", "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")
QWEN_MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]


def with_qwen_markers(path: Path, template: str = CHATML) -> None:
    """A byte-level tokenizer.json gets Qwen's ChatML, reasoning and tool markers as added tokens in
    place of its last (unused) vocabulary entries, and `template` as its chat template."""
    import json

    tok = json.loads((path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    for marker, i in zip(QWEN_MARKERS, range(len(vocab) - len(QWEN_MARKERS), len(vocab))):
        old = next(k for k, v in vocab.items() if v == i)
        del vocab[old]
        vocab[marker] = i
        tok["added_tokens"].append({"id": i, "content": marker, "single_word": False, "lstrip": False, "rstrip": False,
                                    "normalized": False, "special": marker.startswith("<|")})
    (path / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(eos_token="<|im_end|>", chat_template=template)
    (path / "tokenizer_config.json").write_text(json.dumps(config))


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
