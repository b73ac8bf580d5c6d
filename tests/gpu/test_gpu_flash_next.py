"""Flash-Next on a CUDA device (`pytest -m gpu`): its hyper-connection, QSA and PLE ops have CPU
implementations only, so asking for CUDA is refused at startup with the reason and the way out,
before any weight is read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import qwen4exp_reference as ref  # noqa: E402


def test_cuda_is_refused_naming_the_cpu(tmp_path):
    import revolta

    config = {**ref.BASE, "architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text"}
    config["layer_types"] = ["indexed_attention" if t == "full_attention" else t for t in config["layer_types"]]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="device 'cpu'"):
        revolta.LLM(str(tmp_path), device="cuda", load_format="dummy", gpu_memory_utilization=0.0, max_model_len=256)
