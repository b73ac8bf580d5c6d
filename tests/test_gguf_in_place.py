"""A .gguf file given as the model is read in place on the CPU (its quantized blocks kept; only
its metadata, tokenizer and weight map go into the cache, not a float32 copy), by LLM and by the
server's resolution alike; for cuda, or to quantize, it is imported as float32."""

from __future__ import annotations

from revolta import LLM, SamplingParams, demo_gguf
from revolta.models.resolve import load_format_of, resolve_model


def test_a_gguf_file_is_read_in_place(tmp_path, monkeypatch):
    source = demo_gguf()  # (found before the cache moves)
    gguf = tmp_path / "smol.gguf"
    gguf.symlink_to(source)
    monkeypatch.setenv("REVOLTA_CACHE_DIR", str(tmp_path / "cache"))
    llm = LLM(str(gguf), max_model_len=256)
    try:
        (entry,) = list((tmp_path / "cache" / "models").iterdir())
        assert entry.name.startswith("smol-") and not list(entry.glob("*.safetensors"))
        held = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        assert held < 10 << 20  # metadata and tokenizer, against 517 MB of float32 weights
        assert llm.model_info.weight_bytes < 150 << 20  # the Q4_1 / Q8_0 blocks, not 4 bytes a weight
        out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))[0]
        assert "Paris" in out.outputs[0].text
    finally:
        llm.shutdown()
    path = resolve_model(str(gguf), "auto", "cpu")
    assert load_format_of(path, "auto") == "gguf" and load_format_of(path, "dummy") == "dummy"
    assert resolve_model(str(gguf), "gguf", "cuda") == path  # asked for explicitly: in place anywhere
    imported = resolve_model(str(gguf), "safetensors", "cpu")
    assert imported == path + "-float32" and load_format_of(imported, "safetensors") == "auto"
    # The read-in-place directory itself, given for cuda (which has no GGUF kernels): its float32 import.
    assert resolve_model(path, "auto", "cuda") == imported and resolve_model(path, "auto", "cpu") == path
