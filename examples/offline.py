"""The offline Python API: batch generation and a chat turn, with the model's default sampling.

    python examples/offline.py [--model DIR_OR_GGUF]      (no --model: the embedded demo model)
"""

import argparse

from revolta import LLM, SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", default=None)
args = ap.parse_args()

llm = LLM(args.model, max_model_len=1024)
print("default sampling:", llm.default_sampling)  # from the model's generation_config.json

outs = llm.generate(["The three primary colours are", "def fibonacci(n):"],
                    SamplingParams(temperature=0.0, max_tokens=24))
for out in outs:
    print(repr(out.prompt), "->", repr(out.outputs[0].text))

reply = llm.chat([{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])[0]
print("chat:", reply.outputs[0].text)
llm.shutdown()
