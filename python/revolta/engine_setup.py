"""EngineOptions -> the engine's EngineConfig, one way for LLM(...) and the server: the table's
options copied as they are, the Python layer's own translated (the model path resolved, the
speculative and disk-tier JSON, the graph sizes, guided decoding's library and tokenizer)."""

from __future__ import annotations

from pathlib import Path

from revolta import _core
from revolta.config import EngineOptions, table_config
from revolta.guided import grammar_library
from revolta.kv_offload import apply_kv_offloading
from revolta.models.resolve import load_format_of
from revolta.speculative import apply_speculative_config


def engine_config(options: EngineOptions, path: str) -> _core.EngineConfig:
    """path: the resolved model directory (models.resolve.resolve_model). calibration_prompts, which
    calculate_kv_scales needs, are the caller's to set (they need the tokenizer)."""
    cfg = table_config(options)
    cfg.model = path
    cfg.load_format = load_format_of(path, options.load_format)
    cfg.cuda_graph_batch_sizes = list(options.cuda_graph_sizes)
    apply_kv_offloading(cfg, options.kv_offloading_size, options.kv_offloading_eviction, options.kv_offloading_disk)
    apply_speculative_config(cfg, options.speculative_config)
    cfg.guided_decoding_library = grammar_library()
    cfg.tokenizer_json = str(Path(options.tokenizer or path) / "tokenizer.json")
    return cfg
