"""The option schema: every engine, cache, scheduler and server option, validated before any
weight is read. Names follow vLLM's where the meaning is the same."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class EngineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="HF model directory or GGUF file; none: the demo model")
    served_model_name: str | None = Field(None, description="name clients use; default: the model's directory name")
    tokenizer: str | None = Field(None, description="directory with tokenizer.json; default: the model's")
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    kv_cache_dtype: Literal["auto", "float32", "float16", "fp16", "fp8", "fp8_e4m3", "int8"] = Field(
        "auto", description="auto: float32 on the CPU, float16 on cuda; fp8 (E4M3, the checkpoint's per-layer "
        "k_scale / v_scale or 1.0) and int8 (a scale per token and KV head) hold about 2x / 4x the tokens of float16 / "
        "float32")
    calculate_kv_scales: bool = Field(False, description="fp8 KV cache: measure each layer's k / v scales with a "
                                      "pass over a few built-in prompts at startup instead of the checkpoint's")
    load_format: Literal["auto", "dummy", "gguf", "safetensors"] = Field(
        "auto", description="dummy: random weights of the config's shapes; gguf: a .gguf model read in place, its "
        "quantized matrices kept in their blocks (what auto does on the CPU); safetensors: a .gguf model (or the demo) "
        "imported once into the cache as float32")
    block_activation_bits: Literal[8, 16] = Field(
        16, description="CPU, GGUF blocks read in place: 16 keeps decode within float32 rounding of the file's values; "
        "8 is llama.cpp's scheme, about 1.3x faster decode, and a near-tie between two tokens can flip")
    quantization: Literal["auto", "awq", "fp8", "nvfp4"] = Field(
        "auto", description="auto: as the checkpoint's quantization_config says; awq (4-bit) / fp8 (E4M3) / nvfp4: a "
        "checkpoint of that format, or made-up linear layers of it with load_format dummy")
    gpu_memory_utilization: float = Field(0.9, ge=0, le=0.99, description="cuda: share of device memory to use "
                                          "(0: size the KV pool by kv_cache_memory_bytes)")
    enforce_eager: bool = Field(False, description="cuda: no decode graphs")
    cuda_graph_sizes: list[int] = Field(
        default_factory=list, description="cuda: decode batch sizes recorded as graphs at startup (JSON list or "
        "comma-separated); none: 1, 2, 4, multiples of 8 up to 256, of 16 up to 512, and max_num_seqs")
    async_scheduling: Literal["auto", "on", "off"] = Field(
        "auto", description="queue a greedy decode step before the host reads the previous one's tokens (auto: on with cuda)")
    max_model_len: int = Field(0, ge=0, description="0: the model's max_position_embeddings")
    max_num_seqs: int = Field(64, ge=1, le=4096)
    max_num_batched_tokens: int = Field(2048, ge=1)
    scheduling_policy: Literal["fair", "fcfs", "priority"] = Field(
        "fair", description="which waiting request a free slot goes to: fair (round robin across API keys, then across "
        "requests: one request's fan-out cannot hold the others back) | fcfs (arrival) | priority (the request's "
        "`priority`, lower first, then arrival; vLLM's)")
    block_size: int = Field(16, ge=1, le=1024)
    kv_cache_memory_bytes: int = Field(1 << 30, gt=0)
    enable_prefix_caching: bool = True
    kv_offloading_size: float = Field(0.0, ge=0, description="GiB of host memory that full KV blocks are also "
                                      "written to, so prefixes evicted from the device pool are brought back instead "
                                      "of recomputed (vLLM's name); 0: none")
    kv_offloading_eviction: Literal["lru", "arc"] = Field("lru", description="the host tier's eviction")
    kv_offloading_disk: dict[str, Any] | None = Field(
        None, description='a disk tier below it, kept across restarts, as JSON: {"root_dir": "/var/cache/revolta", '
                          '"max_size_bytes": 68719476736, "min_free_bytes": 1073741824}')
    num_threads: int = Field(0, ge=0, le=1024, description="0: all cores (shared by the tensor-parallel ranks)")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="ranks the model is sharded over (heads, DeltaNet "
                                      "heads, MLP and expert intermediates split): threads on the CPU, or a GPU each")
    enable_expert_parallel: bool = Field(False, description="MoE models: each rank holds whole experts, a "
                                         "1 / tensor_parallel_size share of them, instead of a share of every expert")
    seed: int = Field(0, ge=0)
    speculative_config: dict[str, Any] | None = Field(
        None, description='speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, '
                          '"prompt_lookup_max": 4, "prompt_lookup_min": 1}')

    generation_config: str = Field(
        "auto", description="default sampling of requests that leave it out: auto: the model's "
        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens); vllm: "
        "none (temperature 1.0, top_p 1.0); or a directory holding a generation_config.json")
    override_generation_config: dict[str, Any] | None = Field(
        None, description='sampling defaults on top of generation_config, as JSON: {"temperature": 0.2, "top_p": 0.9}')

    @field_validator("cuda_graph_sizes", mode="before")
    @classmethod
    def _sizes_from_text(cls, v: object) -> object:
        if isinstance(v, str):
            text = v.strip()
            return json.loads(text) if text.startswith("[") else [x.strip() for x in text.split(",") if x.strip()]
        return v

    @field_validator("block_activation_bits", mode="before")
    @classmethod
    def _bits_from_text(cls, v: object) -> object:
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v  # (flags and environment give text)

    @field_validator("kv_offloading_disk", mode="before")
    @classmethod
    def _disk_tier(cls, v: object) -> object:
        from revolta.kv_offload import parse_disk

        return parse_disk(v)

    @field_validator("speculative_config", "override_generation_config", mode="before")
    @classmethod
    def _json_object(cls, v: object, info) -> object:
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError as e:
                raise ValueError(f"{info.field_name} is not valid JSON: {e}") from e
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "EngineOptions":
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_model_len and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.device == "cuda" and self.dtype == "bfloat16":
            raise ValueError("dtype bfloat16 is not supported with device=cuda (SM70 has no bf16): use auto or float16")
        return self


class ServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY'")
    reasoning_parser: Literal["qwen3"] | None = None
    tool_call_parser: Literal["qwen3_coder", "hermes"] | None = None
    sse_keepalive_s: float | None = Field(None, gt=0, description="send ': keep-alive' after this many idle seconds")
    max_request_bytes: int = Field(16 << 20, gt=0, description="larger request bodies get HTTP 413 (counted as they arrive)")
    max_waiting_requests: int | None = Field(
        None, ge=0, description="engine requests (n x prompts) that may wait beyond max_num_seqs; more get HTTP 429 "
        "with Retry-After (none: 64 x the sequences that can run at once, max_num_seqs or fewer if the KV cache "
        "holds fewer blocks, and at least 4096; 0: no limit)")
    max_seqs_per_request: int | None = Field(
        None, ge=1, description="engine requests one request may ask for (n x prompts); more get HTTP 400 (none: half "
        "of max_num_seqs + max_waiting_requests, so no single request can fill the queue)")
    request_timeout_s: float | None = Field(None, gt=0, description="abort a request still generating after this many seconds")
    shutdown_timeout_s: float = Field(20.0, ge=0, description="on SIGTERM, let in-flight requests finish this long, then end them")
    max_connections: int = Field(1024, ge=1, description="open connections beyond this are closed at once")
    header_timeout_s: float = Field(10.0, gt=0, description="close a connection whose request head takes longer")
    body_timeout_s: float = Field(60.0, gt=0, description="HTTP 408 when a request body takes longer to arrive")
    write_timeout_s: float = Field(60.0, gt=0, description="drop a client that reads nothing of its response for this long")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="close an idle keep-alive connection after this long")
    allowed_origins: list[str] = Field(default_factory=list, description="CORS origins (JSON list or comma-separated; '*': any); none: CORS off")
    allowed_methods: list[str] = Field(default_factory=lambda: ["*"], description="CORS methods")
    allowed_headers: list[str] = Field(default_factory=lambda: ["*"], description="CORS request headers")
    allow_credentials: bool = Field(False, description="CORS: allow credentials")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    dev_mode: bool = Field(False, description="serve the development endpoints /sleep, /wake_up, /is_sleeping, "
                           "/reset_prefix_cache and /server_info")
    watchdog_config: dict[str, Any] | None = Field(
        None, description='dump every thread\'s stack and turn /health unhealthy when the engine runs no step for '
        'timeout_s while it has requests, as JSON: {"timeout_s": 300, "check_interval_s": 10, "dump_dir": "/tmp"}')

    @field_validator("watchdog_config", mode="before")
    @classmethod
    def _watchdog(cls, v: object) -> object:
        from revolta.server.watchdog import parse_watchdog

        return parse_watchdog(v)

    @field_validator("allowed_origins", "allowed_methods", "allowed_headers", mode="before")
    @classmethod
    def _list_from_text(cls, v: object) -> object:
        """A flag or environment value: a JSON list or comma-separated names."""
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                return json.loads(text)
            return [x.strip() for x in text.split(",") if x.strip()]
        return v


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: EngineOptions = EngineOptions()
    server: ServerOptions = ServerOptions()


# Flat option name -> (section, field). Profiles, environment variables and flags use flat names.
OPTION_SECTIONS: dict[str, str] = {
    **{name: "engine" for name in EngineOptions.model_fields},
    **{name: "server" for name in ServerOptions.model_fields},
}


def build_settings(flat: dict[str, object]) -> Settings:
    """Builds validated Settings from flat option values (unknown names are an error)."""
    unknown = sorted(set(flat) - set(OPTION_SECTIONS))
    if unknown:
        raise ValueError(f"unknown option(s): {', '.join(unknown)}")
    sections: dict[str, dict[str, object]] = {"engine": {}, "server": {}}
    for name, value in flat.items():
        sections[OPTION_SECTIONS[name]][name] = value
    return Settings(engine=EngineOptions(**sections["engine"]), server=ServerOptions(**sections["server"]))
