"""`revolta-server`: resolve options (flags > environment > profile > defaults), load the model,
serve the OpenAI-compatible API with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from revolta.config import EngineOptions, ServerOptions

log = logging.getLogger("revolta.server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# --help sections, in order; an option not named here goes under "Other".
GROUPS = {
    "Model": ["model", "served_model_name", "tokenizer", "dtype", "load_format", "block_activation_bits", "quantization",
              "generation_config",
              "override_generation_config", "seed"],
    "Device and memory": ["device", "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype",
                          "calculate_kv_scales", "enforce_eager", "cuda_graph_sizes", "num_threads"],
    "Scheduling and caching": ["max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                               "scheduling_policy", "enable_prefix_caching", "async_scheduling", "speculative_config"],
    "KV offload": ["kv_offloading_size", "kv_offloading_eviction", "kv_offloading_disk"],
    "Parallelism": ["tensor_parallel_size", "enable_expert_parallel"],
    "Server": ["host", "port", "api_key", "reasoning_parser", "tool_call_parser", "log_level", "dev_mode",
               "watchdog_config"],
    "HTTP limits": ["max_request_bytes", "max_waiting_requests", "max_seqs_per_request", "request_timeout_s", "shutdown_timeout_s",
                    "max_connections", "header_timeout_s", "body_timeout_s", "write_timeout_s", "keep_alive_timeout_s",
                    "sse_keepalive_s"],
    "CORS": ["allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials"],
}


def _choices(annotation) -> list[str] | None:
    """The allowed values of a Literal option (None dropped: leaving the option out means none)."""
    import typing

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in args]
    for a in args:  # Optional[Literal[...]]
        if typing.get_origin(a) is typing.Literal:
            return [str(x) for x in typing.get_args(a)]
    return None


def _help(field) -> str:
    text = field.description or ""
    default = field.default_factory() if field.default_factory else field.default
    if default not in (None, [], {}) and "default:" not in text:
        text = f"{text} (default: {default})" if text else f"default: {default}"
    return text.replace("%", "%%")


def _profiles_help() -> str:
    from revolta.profiles import available_profiles, load_profile_description

    names = available_profiles()
    listed = "; ".join(f"{n}: {load_profile_description(n)}" for n in names) if names else "none found"
    return f"a launch profile by name, or a YAML file (flags and REVOLTA_* variables override it). Profiles: {listed}"


def build_parser() -> argparse.ArgumentParser:
    import revolta

    ap = argparse.ArgumentParser(
        prog="revolta-server", description="Serve a model over OpenAI- and Anthropic-compatible HTTP APIs. Every option "
        "can also come from a profile or an environment variable REVOLTA_<OPTION> (flags win).")
    ap.add_argument("--version", action="version", version=f"revolta-server {revolta.__version__}")
    ap.add_argument("--profile", default=None, help=_profiles_help())
    fields = {**EngineOptions.model_fields, **ServerOptions.model_fields}
    placed = {name for names in GROUPS.values() for name in names}
    sections = [*GROUPS.items(), ("Other", [n for n in fields if n not in placed])]
    for title, names in sections:
        group = ap.add_argument_group(title)
        for name in names:
            if name not in fields:
                continue
            field = fields[name]
            kind = field.annotation
            if kind is bool or str(kind) == "bool":
                group.add_argument(_flag(name), dest=name, default=None, action=argparse.BooleanOptionalAction,
                                   help=_help(field))
            else:
                choices = _choices(kind)
                group.add_argument(_flag(name), dest=name, default=None, choices=choices, help=_help(field),
                                   metavar=None if choices else name.split("_")[-1].upper())
    return ap


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C or SIGTERM before the server runs (while the model loads) ends it with one line; once it
    runs, the server's own handlers drain requests first."""

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        return serve(argv)
    except KeyboardInterrupt:
        print("revolta-server: interrupted before it was serving", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from revolta.profiles import ConfigError, report_line, resolve

    cli = {k: v for k, v in vars(args).items() if k != "profile" and v is not None}
    try:
        settings, report = resolve(cli, args.profile)
    except ConfigError as e:
        print(f"revolta-server: error: {e}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(settings.server.log_level.upper())
    log.debug("%s", report_line(report))  # every option with its source (also in /server_info with --dev-mode)
    s = settings.server
    try:
        sock = listen_socket(s.host, s.port)  # before the model loads: a busy port fails at once
    except OSError as e:
        print(f"revolta-server: error: cannot listen on --host {s.host} --port {s.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        app, engine = build(settings)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        sock.close()
        print(f"revolta-server: error: {e}", file=sys.stderr)
        return 2
    import revolta
    from revolta.server.connection import guarded_protocol

    config = uvicorn.Config(app, log_level=s.log_level, http=guarded_protocol(s), timeout_keep_alive=s.keep_alive_timeout_s,
                            timeout_graceful_shutdown=_ERROR_GRACE_S)
    server = _Server(config, engine, s.shutdown_timeout_s)
    host = f"[{s.host}]" if ":" in s.host else s.host
    log.info("ReVolta %s serving %s at http://%s:%d (OpenAI /v1/..., Anthropic /v1/messages%s)", revolta.__version__,
             app.state.pipeline.served_names[0], host, sock.getsockname()[1],
             ", development endpoints" if s.dev_mode else "")
    try:
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
    if engine.dead:
        log.error("revolta-server stopped: the engine failed: %s", engine.dead)
        return 1
    log.info("revolta-server stopped")
    return 0


# After the drain, the time given to requests to send the error that ends them.
_ERROR_GRACE_S = 5


def listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server with the engine's lifecycle: a signal asks it to stop (a second one forces
    it; uvicorn would re-raise the signal after shutting down and skip the engine's shutdown);
    stopping drains in-flight requests for up to shutdown_timeout_s before the rest are ended
    with an error; a dead engine stops the server, which then exits non-zero."""

    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout_s: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s

    @contextlib.contextmanager
    def capture_signals(self):
        def on_signal(sig, frame):
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def on_tick(self, counter: int) -> bool:
        if self.engine.dead and not self.should_exit:
            log.error("the engine failed (%s): stopping the server", self.engine.dead)
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()  # no new connections
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout_s
        if self.server_state.tasks:
            log.info("draining %d in-flight request(s) for up to %g s", len(self.server_state.tasks), self.shutdown_timeout_s)
        while self.server_state.tasks and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.engine.num_live:
            log.warning("ending %d unfinished engine request(s) at shutdown", self.engine.num_live)
        self.engine.fail_all(503, "the server is shutting down", reason="abort")
        await super().shutdown(sockets)


def build(settings):
    """Loads the engine and tokenizer and returns (app, async engine)."""
    from revolta import _core
    from revolta.models.resolve import load_format_of, resolve_model
    from revolta.kv_calibration import calibration_prompts
    from revolta.guided import grammar_library
    from revolta.kv_offload import apply_kv_offloading
    from revolta.models.tokenizer import Tokenizer
    from revolta.server.app import create_app
    from revolta.server.async_engine import AsyncEngine
    from revolta.speculative import apply_speculative_config

    e = settings.engine
    path = resolve_model(e.model, e.load_format, e.device)
    cfg = _core.EngineConfig()
    for name in ("dtype", "kv_cache_dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "block_size", "kv_cache_memory_bytes", "enable_prefix_caching", "num_threads", "tensor_parallel_size",
                 "enable_expert_parallel", "block_activation_bits",
                 "seed", "load_format", "quantization", "gpu_memory_utilization", "enforce_eager", "async_scheduling",
                 "scheduling_policy"):
        setattr(cfg, name, getattr(e, name))
    cfg.model = path
    cfg.load_format = load_format_of(path, e.load_format)
    cfg.cuda_graph_batch_sizes = e.cuda_graph_sizes
    apply_kv_offloading(cfg, e.kv_offloading_size, e.kv_offloading_eviction, e.kv_offloading_disk)
    apply_speculative_config(cfg, e.speculative_config)
    tokenizer = Tokenizer(e.tokenizer or path)
    cfg.guided_decoding_library = grammar_library()
    cfg.tokenizer_json = str(Path(e.tokenizer or path) / "tokenizer.json")
    if e.calculate_kv_scales:
        cfg.calculate_kv_scales = True
        cfg.calibration_prompts = calibration_prompts(tokenizer)
    from revolta.generation_defaults import describe, generation_defaults

    defaults = generation_defaults(path, e.generation_config, e.override_generation_config)
    core = _core.Engine(cfg)
    info = core.model_info
    log.info("model %s on %s%s: %.2f GB of %s weights%s, KV cache %.2f GB (%s, %d tokens)%s", info.architecture,
             info.device, f" x {info.tensor_parallel_size} tensor-parallel ranks" if info.tensor_parallel_size > 1 else "",
             info.weight_bytes / 1e9, info.weight_dtype, f" ({info.quantization})" if info.quantization else "",
             info.kv_cache_bytes / 1e9, info.kv_cache_dtype, info.kv_cache_tokens,
             f", decode graphs for batch sizes {list(info.cuda_graph_batch_sizes)} in {info.cuda_graph_bytes / 2**20:.0f} MiB"
             if info.cuda_graph_batch_sizes else "")
    for warning in info.warnings:
        log.warning("%s", warning)
    log.info("default sampling (generation_config %s): %s", e.generation_config, describe(defaults))
    engine = AsyncEngine(core, e.max_num_seqs, block_size=e.block_size, scheduling_policy=e.scheduling_policy)
    served = [e.served_model_name or (Path(e.model).name if e.model else "SmolLM2-135M-Instruct")]
    if e.model and e.model not in served:
        served.append(e.model)
    info = {"config": settings.model_dump(mode="json"), "default_sampling": defaults}
    app = create_app(engine, tokenizer, served, settings.server, defaults, info)
    if settings.server.watchdog_config:
        from revolta.server.watchdog import Watchdog

        engine.watchdog = Watchdog(engine, settings.server.watchdog_config).start()
    return app, engine


if __name__ == "__main__":
    sys.exit(main())
