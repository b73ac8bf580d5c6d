"""The option schema: every engine, cache, scheduler and server option, validated before any
weight is read. Names follow vLLM's where the meaning is the same. The engine's own options come
from its option table, read through the binding: an option is a row there (and the code that
uses it), and the schema, `LLM(...)`, the server's flags and docs/options.md follow."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from revolta import _core


# The engine's option table (cpp/include/revolta/engine_options.def), one dict per option: name,
# type (bool | int | float | str), group, choices (space-separated; "": any), min, max (NaN: none), help.
ENGINE_TABLE: list[dict[str, Any]] = _core.engine_options()
_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def choices_of(row: dict[str, Any]) -> list[str]:
    return row["choices"].split()


def _default(name: str) -> object:
    value = getattr(_core.EngineConfig(), name)
    return round(value, 6) if isinstance(value, float) else value  # (a C++ float's 0.9 reads 0.8999999761...)


class _EngineOptionsBase(BaseModel):
    """The options the Python layer adds, or spells its own way, beside the table's."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="HF model directory, GGUF file or Hub id (ORG/NAME: from the HF "
                              "cache, downloaded if missing and the network allows); none: the demo model")
    revision: str | None = Field(None, description="a Hub id's branch, tag or commit; default: main")
    download_dir: str | None = Field(None, description="where Hub models are found and downloaded; default: the HF "
                                     "cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)")
    served_model_name: str | None = Field(None, description="name clients use; default: the model's directory name")
    tokenizer: str | None = Field(None, description="directory with tokenizer.json; default: the model's")
    cuda_graph_sizes: list[int] = Field(
        default_factory=list, description="cuda: decode batch sizes recorded as graphs at startup (JSON list or "
        "comma-separated); none: 1, 2, 4, multiples of 8 up to 256, of 16 up to 512, and max_num_seqs")
    kv_offloading_disk: dict[str, Any] | None = Field(
        None, description='a disk tier below the host tier, kept across restarts, as JSON: {"root_dir": '
                          '"/var/cache/revolta", "max_size_bytes": 68719476736, "min_free_bytes": 1073741824}')
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
        if v is None:  # (LLM(cuda_graph_sizes=None), as before the option table: the default sizes)
            return []
        if isinstance(v, str):
            text = v.strip()
            return json.loads(text) if text.startswith("[") else [x.strip() for x in text.split(",") if x.strip()]
        return v

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
    def _table_checks(self) -> "_EngineOptionsBase":
        table_config(self).validate_options()  # the table's choices and bounds, checked by the engine itself
        return self


def table_config(options: BaseModel) -> _core.EngineConfig:
    """An EngineConfig holding the table's options as `options` has them (the rest at their defaults)."""
    cfg = _core.EngineConfig()
    for row in ENGINE_TABLE:
        name, value = row["name"], getattr(options, row["name"])
        try:
            setattr(cfg, name, value)
        except TypeError:  # (a value the field's C++ type cannot hold, such as a negative seed)
            raise ValueError(f"{name} must be >= {row['min']:g}, got {value}" if not math.isnan(row["min"])
                             else f"{name}: {value!r} is not a {row['type']}") from None
    return cfg


EngineOptions = create_model(
    "EngineOptions", __base__=_EngineOptionsBase, __doc__="Every engine option: the table's and the Python layer's.",
    **{row["name"]: (_TYPES[row["type"]], Field(_default(row["name"]), description=row["help"])) for row in ENGINE_TABLE})


class ServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0: any free one)")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY'")
    reasoning_parser: Literal["qwen3"] | None = Field(None, description="split the model's thinking into reasoning_content")
    tool_call_parser: Literal["qwen3_coder", "hermes"] | None = Field(None, description="the model's tool-call syntax")
    chat_template: str | None = Field(None, description="the chat template to use instead of the model's: a Jinja "
                                      "file's path, or the template itself")
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
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="the server log's level")
    dev_mode: bool = Field(False, description="serve the development endpoints /sleep, /wake_up, /is_sleeping, "
                           "/reset_prefix_cache and /server_info")
    limit_mm_per_prompt: dict[str, int] | None = Field(
        None, description='the most images and videos one prompt may hold, as JSON: {"image": 16, "video": 1}; more '
        'get HTTP 400 (none: no limit but max_model_len)')
    allowed_media_domains: list[str] = Field(
        default_factory=list, description="hosts (and their subdomains) whose http(s) media URLs the server fetches "
        "(JSON list or comma-separated); none: media come as data URLs only")
    allowed_local_media_path: str | None = Field(
        None, description="a directory whose files requests may name as media (file:// URLs); none: no local files")
    media_fetch_timeout_s: float = Field(10.0, gt=0, description="give up fetching a media URL after this long")
    max_media_bytes: int = Field(32 << 20, gt=0, description="the largest media file (encoded) a request may send or name")
    trust_request_mm_kwargs: bool = Field(False, description="accept a request's mm_processor_kwargs (min_pixels, "
                                          "max_pixels: the image budget); otherwise they get HTTP 400")
    watchdog_config: dict[str, Any] | None = Field(
        None, description='dump every thread\'s stack and turn /health unhealthy when the engine runs no step for '
        'timeout_s while it has requests, as JSON: {"timeout_s": 300, "check_interval_s": 10, "dump_dir": "/tmp"}')

    @field_validator("chat_template", mode="after")
    @classmethod
    def _template_text(cls, v: str | None) -> str | None:
        """The template's text, from its file when the value names one; a syntax error is a startup error."""
        if v is None:
            return None
        path = Path(v).expanduser()
        text = path.read_text() if len(v) < 4096 and path.is_file() else v
        if text is v and "{{" not in v and "{%" not in v:
            raise ValueError(f"no file '{v}', and the value is not a Jinja template")
        import jinja2

        try:
            jinja2.Environment().parse(text)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"the template does not parse (line {e.lineno}: {e.message})") from None
        return text

    @field_validator("watchdog_config", mode="before")
    @classmethod
    def _watchdog(cls, v: object) -> object:
        from revolta.server.watchdog import parse_watchdog

        return parse_watchdog(v)

    @field_validator("limit_mm_per_prompt", mode="before")
    @classmethod
    def _mm_limits(cls, v: object) -> object:
        if isinstance(v, str):
            v = json.loads(v)
        if isinstance(v, dict):
            unknown = sorted(set(v) - {"image", "video"})
            if unknown:
                raise ValueError(f"unknown modality {', '.join(unknown)} (image, video)")
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v.values()):
                raise ValueError("each limit is a count >= 0")
        return v

    @field_validator("allowed_origins", "allowed_methods", "allowed_headers", "allowed_media_domains", mode="before")
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


# --help sections of the options outside the engine's table (the table's rows name their own),
# in order; an option placed nowhere goes under "Other".
GROUPS = {
    "Model": ["model", "revision", "download_dir", "served_model_name", "tokenizer", "generation_config",
              "override_generation_config"],
    "Device and memory": ["cuda_graph_sizes"],
    "Scheduling and caching": ["speculative_config"],
    "KV offload": ["kv_offloading_disk"],
    "Parallelism": [],
    "Server": ["host", "port", "api_key", "reasoning_parser", "tool_call_parser", "chat_template", "log_level", "dev_mode",
               "watchdog_config"],
    "HTTP limits": ["max_request_bytes", "max_waiting_requests", "max_seqs_per_request", "request_timeout_s", "shutdown_timeout_s",
                    "max_connections", "header_timeout_s", "body_timeout_s", "write_timeout_s", "keep_alive_timeout_s",
                    "sse_keepalive_s"],
    "CORS": ["allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials"],
    "Multimodal": ["limit_mm_per_prompt", "allowed_media_domains", "allowed_local_media_path", "media_fetch_timeout_s",
                   "max_media_bytes", "trust_request_mm_kwargs"],
}


def option_groups() -> dict[str, list[str]]:
    """Every option's --help section: the table's rows by their group, then the others."""
    groups: dict[str, list[str]] = {}
    for row in ENGINE_TABLE:
        groups.setdefault(row["group"], []).append(row["name"])
    for title, names in GROUPS.items():
        groups.setdefault(title, []).extend(names)
    return groups


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


def describe_errors(e: Exception) -> str:
    """A validation error as one line per option, each naming the option (and its flag)."""
    if isinstance(e, ValidationError):
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"] if x not in ("engine", "server"))
            msg = str(err["msg"]).removeprefix("Value error, ")
            # A validator's message that already starts with the option's name keeps it once.
            if loc and not msg.startswith(loc):
                msg = f"{loc} (--{loc.replace('_', '-')}): {msg}"
            parts.append(msg)
        return "; ".join(parts)
    return str(e)


def literal_values(annotation) -> list[str] | None:
    """The allowed values of a Literal option (None dropped: leaving the option out means none)."""
    import typing

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in args]
    for a in args:  # Optional[Literal[...]]
        if typing.get_origin(a) is typing.Literal:
            return [str(x) for x in typing.get_args(a)]
    return None


def options_reference() -> str:
    """docs/options.md: every option by section, with its flag, default, allowed values and meaning."""
    fields = {**EngineOptions.model_fields, **ServerOptions.model_fields}
    table = {row["name"]: row for row in ENGINE_TABLE}
    lines = ["# Options", "",
             "Every option of `revolta-server` (as `--flag-name`), of a launch profile and of `REVOLTA_<NAME>` "
             "environment variables (flags win over the environment, which wins over the profile); the engine "
             "options are also `revolta.LLM(...)` keywords. Generated from the option schema "
             "(`revolta options > docs/options.md`).", ""]
    for title, names in option_groups().items():
        names = [n for n in names if n in fields]
        if not names:
            continue
        lines += [f"## {title}", "", "| option | default | values | meaning |", "|---|---|---|---|"]
        for name in names:
            field = fields[name]
            default = field.default_factory() if field.default_factory else field.default
            row = table.get(name)
            values = ", ".join(row["choices"].split() if row else literal_values(field.annotation) or [])
            if row and not values and not math.isnan(row["min"]):
                values = f">= {row['min']:g}" + (f", <= {row['max']:g}" if not math.isnan(row["max"]) else "")
            text = (field.description or "").replace("|", "\\|")
            lines.append(f"| `--{name.replace('_', '-')}` | `{default}` | {values} | {text} |")
        lines.append("")
    return "\n".join(lines)
