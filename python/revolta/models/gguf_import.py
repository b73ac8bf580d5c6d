"""Imports a GGUF file (llama and Flash-Next `qwen4exp` architectures, byte-level BPE tokenizer)
into an HF-style directory.

Weights are dequantized to float32 exactly as `gguf.quants.dequantize` defines them, so the
engine and HF transformers (which dequantizes the same way) see identical parameters. A llama file
can instead be read in place (its quantized blocks kept); a Flash-Next file is always imported,
since its tensors must be mapped back onto the checkpoint's layout (models/gguf_qwen4exp.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from revolta.models import gguf_qwen4exp

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


class GGUFImportError(ValueError):
    pass


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_MAP:
        return f"model.layers.{parts[1]}.{_LAYER_MAP[parts[2]]}.{parts[3]}"
    raise GGUFImportError(f"GGUF tensor '{gguf_name}' has no llama counterpart")


def _undo_rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved per head for its rotary layout; HF uses halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _array(t) -> np.ndarray:
    """A GGUF tensor dequantized to float32, in numpy's (row-major, reversed ggml) shape."""
    from gguf.quants import dequantize

    shape = tuple(int(s) for s in reversed(t.shape.tolist()))
    return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)


def import_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True, weights: bool = True) -> Path:
    """Writes config.json, tokenizer.json, tokenizer_config.json, for llama gguf_weights.json (which
    GGUF tensor holds each HF weight, for load_format 'gguf', which reads the file itself) and, with
    weights (always for Flash-Next), model.safetensors in float32 to out_dir (atomically: a
    half-written directory is never left behind)."""
    from gguf import GGUFReader

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file '{gguf_path}' does not exist")
    reader = GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", gguf_qwen4exp.ARCH):
        raise GGUFImportError(f"{gguf_path}: GGUF architecture '{arch}' cannot be imported "
                              f"(supported: llama, {gguf_qwen4exp.ARCH})")
    tok_model = _field(reader, "tokenizer.ggml.model")
    if tok_model != "gpt2":
        raise GGUFImportError(f"{gguf_path}: tokenizer model '{tok_model}' cannot be imported (supported: gpt2)")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))

    tensors = {t.name: t for t in reader.tensors}
    if arch == gguf_qwen4exp.ARCH:
        config = gguf_qwen4exp.config(lambda k, d=None: _field(reader, k, d), tensors, len(tokens))
        eos = _field(reader, "qwen4exp.ple.eos_token_id", _field(reader, "tokenizer.ggml.eos_token_id"))
        config.update(bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"), eos_token_id=eos,
                      pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"))
        mapped = gguf_qwen4exp.tensors(tensors, config, lambda k, d=None: _field(reader, k, d), _array)
        specs = [(name, shape, dtype) for name, shape, dtype, _ in mapped]
        producers = {name: produce for name, _, _, produce in mapped}
        weight_map = None
        weights = True  # (its layout differs from the checkpoint's: never read in place)
    else:
        config, specs, producers, weight_map = _llama(reader, tensors, tokens)
    total = len(specs)
    done = [0]

    def produce(hf_name: str) -> np.ndarray:
        w = producers[hf_name]()
        done[0] += 1
        if progress and (done[0] % 20 == 0 or done[0] == total):
            print(f"\rrevolta: dequantizing {gguf_path.name}: {done[0]}/{total} tensors", end="", file=sys.stderr, flush=True)
        return w

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        from revolta.models.safetensors_io import write_safetensors

        if weights:
            write_safetensors(tmp / "model.safetensors", specs, produce)
            if progress:
                print(file=sys.stderr)
        if weight_map is not None:
            (tmp / "gguf_weights.json").write_text(json.dumps({"file": str(gguf_path.resolve()), "tensors": weight_map},
                                                              indent=1))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        _write_tokenizer(reader, tokens, tmp, config["max_position_embeddings"])
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2)
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _llama(reader, tensors: dict, tokens: list[str]):
    """config, specs, producers and the in-place weight map of a llama file."""
    n_head = int(_field(reader, "llama.attention.head_count"))
    n_kv = int(_field(reader, "llama.attention.head_count_kv", n_head))
    hidden = int(_field(reader, "llama.embedding_length"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(_field(reader, "llama.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": int(_field(reader, "llama.rope.dimension_count", hidden // n_head)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    specs = [(_hf_name(n), tuple(int(s) for s in reversed(t.shape.tolist())), np.float32) for n, t in tensors.items()]

    def produce(t, hf_name: str) -> np.ndarray:
        w = _array(t)
        if hf_name.endswith("q_proj.weight"):
            w = _undo_rope_permute(w, n_head)
        elif hf_name.endswith("k_proj.weight"):
            w = _undo_rope_permute(w, n_kv)
        return w

    producers = {_hf_name(n): (lambda t=t, h=_hf_name(n): produce(t, h)) for n, t in tensors.items()}
    # Q and K rows are stored in llama.cpp's rotary order: the loader regroups them per head.
    heads = {"q_proj": n_head, "k_proj": n_kv}
    weight_map = {_hf_name(n): [n, next((h for k, h in heads.items() if f".{k}." in _hf_name(n)), 0)] for n in tensors}
    return config, specs, producers, weight_map


def reads_in_place(gguf_path: str | Path) -> bool:
    """Whether the engine can read this GGUF file's blocks in place (llama), rather than an import."""
    from gguf import GGUFReader

    return _field(GGUFReader(str(gguf_path)), "general.architecture") == "llama"


def _write_tokenizer(reader, tokens: list[str], out: Path, max_len: int) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = _field(reader, "tokenizer.ggml.pre", "gpt2")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell", "command-r"):
        # These vocabularies were trained with every digit split off before the GPT-2 regex.
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("qwen2", "qwen35"):
        # Qwen's split: single digits, letters with one leading non-letter, newline runs apart.
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
        tk.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    # 3 = control (special), 4 = user-defined (added, not special) in GGUF's token types.
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, ty in enumerate(types) if ty == 3]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, ty in enumerate(types) if ty == 4]
    tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)
    tk.save(str(out / "tokenizer.json"))

    def tok(key: str) -> str | None:
        idx = _field(reader, key)
        return tokens[int(idx)] if idx is not None else None

    tcfg = {
        "bos_token": tok("tokenizer.ggml.bos_token_id"),
        "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "unk_token": tok("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "model_max_length": max_len,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
