"""The official openai SDK against revolta-server: a streamed chat, and a forced tool call.

    revolta-server --profile cpu-demo --tool-call-parser hermes      (in another shell)
    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1]
"""

import argparse
import json

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
args = ap.parse_args()
client = OpenAI(base_url=args.base_url, api_key="unused")
model = client.models.list().data[0].id

stream = client.chat.completions.create(model=model, stream=True, max_tokens=48,
                                        messages=[{"role": "user", "content": "Write a haiku about the sea."}])
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()

weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
r = client.chat.completions.create(model=model, max_tokens=64, tools=[weather], tool_choice="required",
                                   messages=[{"role": "user", "content": "Weather in Oslo for 3 days?"}])
call = r.choices[0].message.tool_calls[0]
print("tool call:", call.function.name, json.loads(call.function.arguments))
