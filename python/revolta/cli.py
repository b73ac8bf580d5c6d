"""Command line: `revolta generate` runs a prompt (or a chat turn) through the engine; `revolta
quantize --awq | --fp8` writes a 4-bit AWQ or an FP8 copy of a model directory; `revolta cache ls |
rm` lists or removes what the cache holds (imported GGUF models, downloads); `revolta run-batch`
runs an OpenAI batch file through the server's endpoints (revolta.server.batch)."""

from __future__ import annotations

import argparse
import sys
import time


def _generate(args: argparse.Namespace) -> int:
    from revolta import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, max_model_len=args.max_model_len, num_threads=args.threads)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    if args.prompt is not None:
        out = llm.generate(args.prompt, params)[0]
    else:
        out = llm.chat([{"role": "user", "content": args.chat}], params)[0]
    dt = time.perf_counter() - t0
    completion = out.outputs[0]
    print(completion.text)
    print(
        f"[{len(out.prompt_token_ids)} prompt tokens, {len(completion.token_ids)} generated in {dt:.2f}s, "
        f"finish_reason={completion.finish_reason}, weights {llm.model_info.weight_dtype}]",
        file=sys.stderr,
    )
    llm.shutdown()
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from revolta.models.resolve import resolve_model
    from revolta.quantize import quantize_awq, quantize_fp8

    if args.awq == args.fp8:
        raise ValueError("name one format: --awq or --fp8")
    src = resolve_model(args.model, device=None)  # float32 safetensors to quantize
    out = quantize_awq(src, args.out, args.group_size) if args.awq else quantize_fp8(src, args.out)
    print(f"wrote {out}")
    return 0


def _entries() -> list:
    from revolta.models.resolve import cache_dir

    root = cache_dir()
    return [p for kind in ("models", "downloads") if (root / kind).is_dir() for p in sorted((root / kind).iterdir())]


def _size(p) -> int:
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _cache(args: argparse.Namespace) -> int:
    import shutil

    from revolta.models.resolve import cache_dir

    entries = _entries()
    if args.action == "ls":
        print(f"{cache_dir()} (REVOLTA_CACHE_DIR moves it)")
        for p in entries:
            print(f"{_size(p) / 2**20:10.1f} MiB  {p.parent.name}/{p.name}")
        print(f"{sum(_size(p) for p in entries) / 2**20:10.1f} MiB  in all")
        return 0
    if not args.names and not args.all:
        raise ValueError("cache rm: name entries (as `revolta cache ls` shows them) or give --all")
    chosen = entries if args.all else []
    for name in args.names:
        match = [p for p in entries if name in (p.name, f"{p.parent.name}/{p.name}")]
        if not match:
            raise ValueError(f"cache rm: no entry '{name}' (see `revolta cache ls`)")
        chosen += match
    for p in chosen:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        print(f"removed {p.parent.name}/{p.name}")
    return 0


def _options(args) -> int:
    from revolta.config import options_reference

    print(options_reference(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run-batch"]:  # the server's options and its own (revolta.server.batch)
        from revolta.server.batch import main as run_batch

        return run_batch(argv[1:])
    parser = argparse.ArgumentParser(prog="revolta", description="ReVolta inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt or one chat message")
    g.add_argument("--model", default=None, help="HF model directory or GGUF file (default: the demo model)")
    what = g.add_mutually_exclusive_group()
    what.add_argument("--prompt", default=None, help="raw text prompt")
    what.add_argument("--chat", default="What is the capital of France? Answer in one sentence.", help="user message, rendered with the chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    g.add_argument("--max-model-len", type=int, default=0)
    g.add_argument("--threads", type=int, default=0)
    qz = sub.add_parser("quantize", help="write a quantized copy of a model directory")
    qz.add_argument("--model", default=None, help="HF model directory or GGUF file (default: the demo model)")
    qz.add_argument("--awq", action="store_true", help="4-bit AWQ (AutoAWQ GEMM layout), round to nearest")
    qz.add_argument("--fp8", action="store_true", help="FP8 E4M3 with a scale per 128 x 128 block (HF fp8 layout)")
    qz.add_argument("--group-size", type=int, default=128, choices=[32, 128], help="AWQ: values per scale and zero point")
    qz.add_argument("out", help="directory to write")
    c = sub.add_parser("cache", help="list or remove what the cache holds (imported models, downloads)")
    c.add_argument("action", choices=["ls", "rm"])
    c.add_argument("names", nargs="*", help="rm: entries as `ls` shows them (models/NAME, or NAME)")
    c.add_argument("--all", action="store_true", help="rm: every entry")
    sub.add_parser("options", help="print the option reference (docs/options.md) as Markdown")
    sub.add_parser("run-batch", help="run an OpenAI batch file (-i IN.jsonl -o OUT.jsonl, and the server's options; "
                                     "see `revolta run-batch --help`)")
    args = parser.parse_args(argv)
    run = {"generate": _generate, "quantize": _quantize, "cache": _cache, "options": _options}[args.command]
    try:
        return run(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"revolta: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
