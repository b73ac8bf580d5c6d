"""`revolta-server`: resolve options (flags > environment > profile > defaults), load the model,
serve the OpenAI-compatible API with uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from pathlib import Path

import uvicorn

from revolta.config import EngineOptions, ServerOptions

log = logging.getLogger("revolta.server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="revolta-server", description="Serve a model over an OpenAI-compatible HTTP API.")
    ap.add_argument("--profile", default=None, help="launch profile name (configs/profiles/NAME.yaml) or a YAML path")
    for model in (EngineOptions, ServerOptions):
        for name, field in model.model_fields.items():
            kind = field.annotation
            if kind is bool or str(kind) == "bool":
                ap.add_argument(_flag(name), dest=name, default=None, action=argparse.BooleanOptionalAction, help=field.description)
            else:
                ap.add_argument(_flag(name), dest=name, default=None, help=field.description)
    return ap


def main(argv: list[str] | None = None) -> int:
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
    log.info("%s", report_line(report))
    try:
        app, engine = build(settings)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"revolta-server: error: {e}", file=sys.stderr)
        return 2
    s = settings.server
    server = _Server(uvicorn.Config(app, host=s.host, port=s.port, log_level=s.log_level, timeout_graceful_shutdown=5))
    try:
        server.run()
    finally:
        engine.shutdown()
    log.info("revolta-server stopped")
    return 0


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, which would skip the engine
    shutdown and end the process by signal; here a signal only asks the server to stop (a second
    one forces it)."""

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


def build(settings):
    """Loads the engine and tokenizer and returns (app, async engine)."""
    from revolta import _core
    from revolta.models.resolve import resolve_model
    from revolta.models.tokenizer import Tokenizer
    from revolta.server.app import create_app
    from revolta.server.async_engine import AsyncEngine

    e = settings.engine
    path = resolve_model(e.model)
    cfg = _core.EngineConfig()
    for name in ("dtype", "kv_cache_dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "block_size", "kv_cache_memory_bytes", "enable_prefix_caching", "num_threads", "seed", "load_format",
                 "gpu_memory_utilization", "enforce_eager", "async_scheduling"):
        setattr(cfg, name, getattr(e, name))
    cfg.model = path
    engine = AsyncEngine(_core.Engine(cfg))
    tokenizer = Tokenizer(e.tokenizer or path)
    served = [e.served_model_name or (Path(e.model).name if e.model else "SmolLM2-135M-Instruct")]
    if e.model and e.model not in served:
        served.append(e.model)
    return create_app(engine, tokenizer, served, settings.server), engine


if __name__ == "__main__":
    sys.exit(main())
