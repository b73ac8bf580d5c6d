"""ReVolta: an LLM inference engine with a C++ core.

    from revolta import LLM, SamplingParams
    llm = LLM()  # the embedded demo model, SmolLM2-135M-Instruct, on the CPU
    print(llm.generate("The capital of France is", SamplingParams(temperature=0))[0].outputs[0].text)
"""

from revolta.beam_search import BeamSearchParams
from revolta.llm import LLM
from revolta.models.resolve import demo_gguf, demo_model
from revolta.outputs import CompletionOutput, RequestOutput
from revolta.guided import GuidedDecodingParams
from revolta.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "GuidedDecodingParams", "RequestOutput", "CompletionOutput", "demo_model", "demo_gguf"]
