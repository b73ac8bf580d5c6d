"""`revolta run-batch -i IN.jsonl -o OUT.jsonl [server options]`: an OpenAI batch file (one request a
line: {"custom_id", "method": "POST", "url", "body"}) run through this server's own endpoints in
process, each answer written as a line of the Batch API's output file
({"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}). Lines the output
already answers with status 200 are kept and not run again, so a stopped run resumes; the rest
are (re)written as they finish, with the progress on stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path

import httpx

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/score",
        "/v1/rerank")


def read_requests(path: Path) -> list[dict]:
    """The input's requests; ValueError naming the line of the first malformed one or a repeated custom_id."""
    out, seen = [], set()
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{no}: not JSON ({e})") from None
        if not isinstance(req, dict) or not isinstance(req.get("custom_id"), str) or not isinstance(req.get("body"), dict):
            raise ValueError(f"{path}:{no}: a request line needs a string custom_id and an object body")
        if req["custom_id"] in seen:
            raise ValueError(f"{path}:{no}: custom_id '{req['custom_id']}' repeats an earlier line")
        seen.add(req["custom_id"])
        out.append(req)
    return out


def answered(path: Path) -> dict[str, str]:
    """custom_id -> output line, of the lines an earlier run answered with status 200."""
    done: dict[str, str] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # (a line cut short when a run stopped)
        if isinstance(item, dict) and (item.get("response") or {}).get("status_code") == 200:
            done[item["custom_id"]] = line
    return done


def output_line(req: dict, status: int | None, body: dict | None, error: str | None = None) -> str:
    rid = "batch_req_" + uuid.uuid4().hex[:24]
    response = None if status is None else {"status_code": status, "request_id": rid, "body": body}
    return json.dumps({"id": rid, "custom_id": req["custom_id"], "response": response,
                       "error": None if error is None else {"code": "invalid_request", "message": error}},
                      ensure_ascii=False)


async def run_requests(app, requests: list[dict], write, concurrency: int, progress) -> int:
    """Posts each request to `app` (at most `concurrency` at once), writes its output line as it
    finishes; returns how many did not answer 200."""
    failed = 0
    limit = asyncio.Semaphore(concurrency)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://run-batch", timeout=None) as client:
        async def one(req: dict) -> tuple[str, bool]:
            url, method, body = req.get("url"), req.get("method", "POST"), req["body"]
            if method != "POST" or url not in URLS:
                return output_line(req, None, None, f"method {method} {url} is not one of POST {', '.join(URLS)}"), False
            if body.get("stream"):
                return output_line(req, None, None, "a batch request cannot stream (\"stream\": true)"), False
            async with limit:
                r = await client.post(url, json=body)
            return output_line(req, r.status_code, r.json()), r.status_code == 200

        for done, task in enumerate(asyncio.as_completed([one(r) for r in requests]), 1):
            line, ok = await task
            write(line)
            failed += not ok
            progress(done, failed)
    return failed


def main(argv: list[str] | None = None) -> int:
    from revolta.server.cli import build, build_parser
    from revolta.profiles import ConfigError, resolve

    ap = build_parser()
    ap.prog = "revolta run-batch"
    ap.description = __doc__.split("\n\n")[0]
    ap.add_argument("-i", "--input-file", required=True, help="the batch file: one request a line (OpenAI's format)")
    ap.add_argument("-o", "--output-file", required=True, help="the answers (resumed when it holds some already)")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight at once (default: 64)")
    args = ap.parse_args(argv)
    src, dst = Path(args.input_file), Path(args.output_file)
    try:
        requests = read_requests(src)
        cli = {k: v for k, v in vars(args).items()
               if k not in ("profile", "input_file", "output_file", "concurrency") and v is not None}
        settings, _ = resolve(cli, args.profile)
        if args.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"revolta run-batch: error: {e}", file=sys.stderr)
        return 2
    kept = answered(dst)
    todo = [r for r in requests if r["custom_id"] not in kept]
    print(f"revolta run-batch: {len(requests)} requests, {len(kept)} answered by an earlier run, {len(todo)} to run",
          file=sys.stderr)
    try:
        app, engine = build(settings)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"revolta run-batch: error: {e}", file=sys.stderr)
        return 2

    def progress(done: int, failed: int) -> None:
        print(f"\rrevolta run-batch: {done}/{len(todo)} done, {failed} not answered 200", end="", file=sys.stderr, flush=True)

    try:
        with dst.open("w") as out:
            for line in kept.values():
                out.write(line + "\n")

            def write(line: str) -> None:
                out.write(line + "\n")
                out.flush()

            failed = asyncio.run(run_requests(app, todo, write, args.concurrency, progress))
    finally:
        engine.shutdown()
    print(file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
