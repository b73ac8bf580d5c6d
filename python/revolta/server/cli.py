"""`revolta-server`: resolve options (flags > environment > profile > defaults), load the model,
serve the OpenAI-compatible API with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import uvicorn

from revolta.config import ENGINE_TABLE, EngineOptions, ServerOptions, literal_values, option_groups

log = logging.getLogger("revolta.server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


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
    table = {row["name"]: row for row in ENGINE_TABLE}
    groups = option_groups()
    placed = {name for names in groups.values() for name in names}
    sections = [*groups.items(), ("Other", [n for n in fields if n not in placed])]
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
                choices = table[name]["choices"].split() if name in table else literal_values(kind)
                choices = choices or None
                group.add_argument(_flag(name), dest=name, default=None, choices=choices, help=_help(field),
                                   metavar=None if choices else name.split("_")[-1].upper())
    return ap


class StopRequest:
    """Ctrl-C or SIGTERM before the server's own handlers run, noted and acted on at the next
    checkpoint (`check`): a KeyboardInterrupt raised at whatever bytecode the signal lands on can
    fall inside an import or a library's native callback, which turns it into another error (a
    traceback) or leaves it escaping past the handler (the process then dies of SIGINT)."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C or SIGTERM before the server runs (while the model loads) ends it with one line; once it
    runs, the server's own handlers drain requests first."""
    stop = StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return serve(argv, stop)
    except KeyboardInterrupt:
        print("revolta-server: interrupted before it was serving", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def process_age() -> float:
    """Seconds since this process started (its imports included), where /proc tells; else 0."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def serve(argv: list[str] | None = None, stop: StopRequest | None = None) -> int:
    t0 = time.perf_counter() - process_age()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from revolta.profiles import ConfigError, profile_line, report_line, resolve

    cli = {k: v for k, v in vars(args).items() if k != "profile" and v is not None}
    try:
        settings, report = resolve(cli, args.profile)
    except ConfigError as e:
        print(f"revolta-server: error: {e}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(settings.server.log_level.upper())
    log.debug("%s", report_line(report))  # every option with its source (also in /server_info with --dev-mode)
    if args.profile:
        log.info("%s", profile_line(args.profile, report))
    s = settings.server
    try:
        sock = listen_socket(s.host, s.port)  # before the model loads: a busy port fails at once
    except OSError as e:
        print(f"revolta-server: error: cannot listen on --host {s.host} --port {s.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    import revolta
    from revolta.server.connection import guarded_protocol

    stop = stop or StopRequest()
    stop.check()

    # From the engine's start to the server's own signal handlers, a signal (KeyboardInterrupt) must
    # still shut the engine down: its threads left running into interpreter exit abort the process.
    engine = None
    try:
        try:
            t_build = time.perf_counter()
            app, engine = build(settings, stop)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            sock.close()
            print(f"revolta-server: error: {e}", file=sys.stderr)
            return 2
        config = uvicorn.Config(app, log_level=s.log_level, http=guarded_protocol(s),
                                timeout_keep_alive=s.keep_alive_timeout_s, timeout_graceful_shutdown=_ERROR_GRACE_S)
        stop.check()
        server = _Server(config, engine, s.shutdown_timeout_s, stop)
        host = f"[{s.host}]" if ":" in s.host else s.host
        log.info("ReVolta %s serving %s at http://%s:%d (OpenAI /v1/..., Anthropic /v1/messages%s); ready %.1f s after "
                 "start (model and engine %.1f s)", revolta.__version__, app.state.pipeline.served_names[0], host,
                 sock.getsockname()[1], ", development endpoints" if s.dev_mode else "", time.perf_counter() - t0,
                 time.perf_counter() - t_build)
        app.state.pipeline.jobs.started = t0
        server.run(sockets=[sock])
    finally:
        if engine is not None:
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

    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout_s: float, stop: StopRequest | None = None):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s
        self.stop = stop

    @contextlib.contextmanager
    def capture_signals(self):
        def on_signal(sig, frame):
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        if self.stop is not None and self.stop.signum is not None:  # came after the last checkpoint
            self.should_exit = True
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


def build(settings, stop: StopRequest | None = None):
    """Loads the engine and tokenizer and returns (app, async engine); `stop` is checked before the
    model loads and after."""
    from revolta import _core
    from revolta.engine_setup import engine_config
    from revolta.kv_calibration import calibration_prompts
    from revolta.models.resolve import resolve_model
    from revolta.models.tokenizer import Tokenizer
    from revolta.server.app import create_app
    from revolta.server.async_engine import AsyncEngine
    from revolta.server.media import no_media_allowed

    e = settings.engine
    path = resolve_model(e.model, e.load_format, e.device, e.revision, e.download_dir)
    cfg = engine_config(e, path)
    if no_media_allowed(settings.server.limit_mm_per_prompt):
        cfg.language_model_only = True  # the vision tower is not loaded (vLLM's rule)
    tokenizer = Tokenizer(e.tokenizer or path)
    if settings.server.chat_template:
        tokenizer.use_chat_template(settings.server.chat_template)
    if e.calculate_kv_scales:
        cfg.calibration_prompts = calibration_prompts(tokenizer)
    if stop:
        stop.check()
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
    try:
        served = [e.served_model_name or (Path(e.model).name if e.model else "SmolLM2-135M-Instruct")]
        if e.model and e.model not in served:
            served.append(e.model)
        info = {"config": settings.model_dump(mode="json"), "default_sampling": defaults}
        app = create_app(engine, tokenizer, served, settings.server, defaults, info, model_dir=str(path))
        if settings.server.watchdog_config:
            from revolta.server.watchdog import Watchdog

            engine.watchdog = Watchdog(engine, settings.server.watchdog_config).start()
    except BaseException:
        # A signal or error here must still stop the pump thread: left running into interpreter
        # exit, it dies inside C++ code and aborts the process.
        engine.shutdown()
        raise
    return app, engine


if __name__ == "__main__":
    sys.exit(main())
