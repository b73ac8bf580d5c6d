"""Tensor parallelism's NCCL path on this machine's GPUs (run on the device: `pytest -m gpu`): the
C++ executable revolta_gpu_tp_tests checks NCCL collectives on device tensors and sharded models
(dense and hybrid MoE) driven through a NCCL communicator, eager and in decode graphs, against the
unsharded model. With one GPU the group has one rank; the multi-GPU runs are
benchmarks/bench_tensor_parallel.py --device cuda."""

import subprocess
from pathlib import Path

import pytest

import revolta

pytestmark = pytest.mark.gpu


def test_nccl_communicator_and_sharded_models_on_the_gpu():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_gpu_tp_tests"
    assert exe.is_file(), "this build has no CUDA backend: build with REVOLTA_CUDA=ON to run the GPU tests"
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout and "with decode graphs" in proc.stdout


@pytest.mark.parametrize("kind", ["llama", "qwen3_next"])
def test_ranks_on_several_gpus_give_the_tokens_of_one(kind, tmp_path):
    """`tensor_parallel_size` 2 and 4 on as many GPUs (a rank per GPU, NCCL between them, decode
    graphs recording the collectives) against one GPU, greedy, four requests at once."""
    import torch

    from conftest import make_hf_model

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"{gpus} GPU here: ranks on several GPUs need a machine with 2 or more")
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                 linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
                 head_dim=32, num_hidden_layers=4) if kind == "qwen3_next" else {}
    make_hf_model(kind, tmp_path, seed=4, hidden_size=128, num_attention_heads=4, intermediate_size=256, **extra)
    prompts = [[1, 17, 93, 4, 250, 61, 8, 140], [1, 5, 5, 200, 31], [1, 77] * 9, [1, 3, 9, 27]]
    params = revolta.SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for tp in [t for t in (1, 2, 4) if t <= gpus]:
        with revolta.LLM(str(tmp_path), device="cuda", tensor_parallel_size=tp, max_model_len=256,
                         gpu_memory_utilization=0.3) as llm:
            tokens[tp] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    for tp, got in tokens.items():
        assert got == tokens[1], f"tensor_parallel_size {tp}"
