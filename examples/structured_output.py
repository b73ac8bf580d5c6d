"""Structured output: a JSON schema the reply must follow, through the openai SDK (response_format)
and offline (SamplingParams(guided_decoding=...)).

    revolta-server --profile cpu-demo      (in another shell)
    python examples/structured_output.py [--base-url http://127.0.0.1:8000/v1] [--offline]
"""

import argparse
import json

person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0}}}

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
ap.add_argument("--offline", action="store_true", help="use the offline API instead of a server")
args = ap.parse_args()

if args.offline:
    from revolta import LLM, GuidedDecodingParams, SamplingParams

    llm = LLM(max_model_len=512)
    out = llm.chat([{"role": "user", "content": "Describe a person."}],
                   SamplingParams(max_tokens=64, guided_decoding=GuidedDecodingParams(json=person)))[0]
    print(json.dumps(json.loads(out.outputs[0].text)))
    llm.shutdown()
else:
    from openai import OpenAI

    client = OpenAI(base_url=args.base_url, api_key="unused")
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=64,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}})
    print(json.dumps(json.loads(r.choices[0].message.content)))
