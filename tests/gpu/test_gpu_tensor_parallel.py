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
