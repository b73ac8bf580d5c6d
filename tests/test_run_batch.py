"""`revolta run-batch`: an OpenAI batch file through the server's own endpoints, in process, with
the answers as the Batch API's output lines; a second run resumes, leaving answered lines alone."""

from __future__ import annotations

import json
from pathlib import Path

from revolta.cli import main


def line(custom_id: str, url: str, body: dict, method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


ASK = [{"role": "user", "content": "What is the capital of France?"}]


def run(demo_model_dir, src, dst) -> int:
    return main(["run-batch", "-i", str(src), "-o", str(dst), "--model", demo_model_dir, "--max-model-len", "256",
                 "--kv-cache-memory-bytes", str(16 << 20), "--concurrency", "3"])


def test_batch_file_runs_and_resumes(demo_model_dir, tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    model = Path(demo_model_dir).name  # (the served name)
    first = [line("chat-1", "/v1/chat/completions", {"model": model, "messages": ASK, "max_tokens": 8, "temperature": 0}),
             line("done-2", "/v1/completions", {"prompt": "Paris is", "max_tokens": 4, "temperature": 0}),
             line("bad-3", "/v1/chat/completions", {"messages": ASK, "temperature": 9}),
             line("url-4", "/v1/images/generations", {"prompt": "x"}),
             line("msg-5", "/v1/messages", {"model": model, "max_tokens": 8, "messages": ASK}),
             line("emb-7", "/v1/embeddings", {"input": ["Paris", "Rome"]})]
    src.write_text("\n".join(first) + "\n")
    assert run(demo_model_dir, src, dst) == 1  # two lines are not answered 200
    out = {o["custom_id"]: o for o in map(json.loads, dst.read_text().splitlines())}
    assert set(out) == {"chat-1", "done-2", "bad-3", "url-4", "msg-5", "emb-7"}
    assert [len(d["embedding"]) for d in out["emb-7"]["response"]["body"]["data"]] == [576, 576]
    assert out["chat-1"]["response"]["status_code"] == 200 and "Paris" in out["chat-1"]["response"]["body"]["choices"][0]["message"]["content"]
    assert out["done-2"]["response"]["body"]["object"] == "text_completion"
    assert out["msg-5"]["response"]["body"]["type"] == "message"
    bad = out["bad-3"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "temperature"
    assert out["url-4"]["response"] is None and "/v1/images/generations" in out["url-4"]["error"]["message"]

    # Resumed with one more line: the answered lines are kept as they were, the others run again.
    src.write_text(src.read_text() + line("chat-6", "/v1/chat/completions", {"messages": ASK, "max_tokens": 4}) + "\n")
    assert run(demo_model_dir, src, dst) == 1
    again = {o["custom_id"]: o for o in map(json.loads, dst.read_text().splitlines())}
    assert set(again) == set(out) | {"chat-6"} and len(dst.read_text().splitlines()) == 7
    for kept in ("chat-1", "done-2", "msg-5"):
        assert again[kept]["id"] == out[kept]["id"]  # not run again
    assert again["bad-3"]["id"] != out["bad-3"]["id"] and again["chat-6"]["response"]["status_code"] == 200


def test_bad_batch_files_are_refused_by_line(demo_model_dir, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(line("a", "/v1/completions", {"prompt": "x"}) + "\n" + line("a", "/v1/completions", {"prompt": "y"}) + "\n")
    assert run(demo_model_dir, src, tmp_path / "out.jsonl") == 2
    assert "in.jsonl:2: custom_id 'a' repeats" in capsys.readouterr().err
    src.write_text("{not json\n")
    assert run(demo_model_dir, src, tmp_path / "out.jsonl") == 2
    assert "in.jsonl:1: not JSON" in capsys.readouterr().err
