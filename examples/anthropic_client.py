"""The official anthropic SDK against revolta-server: a message, and a streamed one.

    revolta-server --profile cpu-demo      (in another shell)
    python examples/anthropic_client.py [--base-url http://127.0.0.1:8000]
"""

import argparse

import anthropic

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000")
ap.add_argument("--model", default="SmolLM2-135M-Instruct")
args = ap.parse_args()
client = anthropic.Anthropic(base_url=args.base_url, api_key="unused")

msg = client.messages.create(model=args.model, max_tokens=48,
                             messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
print(msg.content[0].text, f"[{msg.stop_reason}, {msg.usage.input_tokens} in / {msg.usage.output_tokens} out]")

with client.messages.stream(model=args.model, max_tokens=48,
                            messages=[{"role": "user", "content": "Name three rivers."}]) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()
