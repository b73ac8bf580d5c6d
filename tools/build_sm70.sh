#!/usr/bin/env bash
# The SM70 (V100) lane: clang-19 compiles the CUDA backend for sm_70 machine code plus compute_70
# PTX over CUDA 12.9 pieces taken from PyPI wheels (CUDA 13's nvcc no longer targets sm_70).
#
#   tools/build_sm70.sh [BUILD_DIR]      (default build-sm70)
#
# Builds the op harness revolta_op_tests, revolta_bench and revolta_gpu_tp_tests (NCCL from its CUDA
# 12 wheel); the ptxas resource report (registers, spills, shared
# memory per kernel) goes to BUILD_DIR/ptxas-report.txt. The binaries run on any GPU of compute
# capability >= 7.0 (newer ones JIT-compile the PTX) with BUILD_DIR/cuda-12.9/lib64 beside them.
set -euo pipefail
BUILD_DIR=$(mkdir -p "${1:-build-sm70}" && cd "${1:-build-sm70}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TK="$BUILD_DIR/cuda-12.9"
CUDA13_FATBINARY=${CUDA13_FATBINARY:-/usr/local/cuda/bin/fatbinary}

command -v clang++-19 >/dev/null || { echo "clang++-19 is missing: apt-get install -y clang-19" >&2; exit 1; }
[ -x "$CUDA13_FATBINARY" ] || { echo "no fatbinary at $CUDA13_FATBINARY (set CUDA13_FATBINARY)" >&2; exit 1; }

if [ ! -f "$TK/version.txt" ]; then
  echo "revolta: preparing the CUDA 12.9 pieces in $TK" >&2
  mkdir -p "$BUILD_DIR/wheels" "$TK/bin" "$TK/include" "$TK/lib64" "$TK/nvvm/libdevice"
  python3 -m pip download --no-deps -q -d "$BUILD_DIR/wheels" \
    nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27
  tmp=$(mktemp -d)
  for w in "$BUILD_DIR"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tmp"; done
  cp "$tmp/nvidia/cuda_nvcc/bin/ptxas" "$TK/bin/" && chmod +x "$TK/bin/ptxas"
  cp -r "$tmp/nvidia/cuda_nvcc/nvvm/libdevice/." "$TK/nvvm/libdevice/"
  cp -r "$tmp/nvidia/cuda_nvcc/include/." "$TK/include/"
  cp -r "$tmp/nvidia/cuda_runtime/include/." "$TK/include/"
  cp -r "$tmp/nvidia/cuda_cccl/include/." "$TK/include/"
  cp -a "$tmp/nvidia/cuda_runtime/lib/." "$TK/lib64/"
  ln -sf libcudart.so.12 "$TK/lib64/libcudart.so"
  touch "$TK/include/curand_mtgp32_kernel.h"  # clang's wrapper includes it; cuRAND is not used
  rm -rf "$tmp"
  # CMake identifies the toolkit by asking nvcc; this stub only answers those two questions.
  cat > "$TK/bin/nvcc" <<STUB
#!/usr/bin/env bash
case " \$* " in
  *" --version "*) echo "Cuda compilation tools, release 12.9, V12.9.86" ;;
  *) echo "#\\\$ TOP=$TK" >&2; echo "#\\\$ NVVMIR_LIBRARY_DIR=$TK/nvvm/libdevice" >&2 ;;
esac
STUB
  # clang 19 calls fatbinary with the legacy --image= form; CUDA 13's takes only --image3=.
  cat > "$TK/bin/fatbinary" <<WRAP
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in
    --image=profile=sm_*) p=\${a#--image=profile=sm_}; args+=("--image3=kind=elf,sm=\${p%%,*},file=\${a##*,file=}") ;;
    --image=profile=compute_*) p=\${a#--image=profile=compute_}; args+=("--image3=kind=ptx,sm=\${p%%,*},file=\${a##*,file=}") ;;
    *) args+=("\$a") ;;
  esac
done
exec "$CUDA13_FATBINARY" "\${args[@]}"
WRAP
  chmod +x "$TK/bin/nvcc" "$TK/bin/fatbinary"
  echo "CUDA Version 12.9.86" > "$TK/version.txt"
fi

# NCCL for tensor parallelism (headers and library from the CUDA 12 wheel).
if [ ! -f "$TK/nccl/include/nccl.h" ]; then
  python3 -m pip download --no-deps -q -d "$BUILD_DIR/wheels" nvidia-nccl-cu12==2.27.7
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$BUILD_DIR"/wheels/nvidia_nccl_cu12-*.whl "$tmp"
  mkdir -p "$TK/nccl" && cp -r "$tmp/nvidia/nccl/include" "$tmp/nvidia/nccl/lib" "$TK/nccl/"
  rm -rf "$tmp"
fi
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$TK/nccl" \
  -DREVOLTA_CUDA=ON -DREVOLTA_PYTHON=OFF -DREVOLTA_NATIVE=OFF -DREVOLTA_TESTS=OFF -DREVOLTA_EXAMPLES=OFF \
  -DCMAKE_CXX_FLAGS="-mavx2 -mfma -mf16c" -DCMAKE_EXE_LINKER_FLAGS="-L$TK/lib64" -DCMAKE_SHARED_LINKER_FLAGS="-L$TK/lib64" \
  -DCMAKE_CUDA_COMPILER=clang++-19 -DCMAKE_CUDA_ARCHITECTURES=70 -DCUDAToolkit_ROOT="$TK" \
  -DCMAKE_CUDA_FLAGS="-Wno-unknown-cuda-version --cuda-include-ptx=sm_70" -DCMAKE_CUDA_RUNTIME_LIBRARY=None \
  -DCMAKE_CUDA_FLAGS_RELEASE="-O3 -DNDEBUG"  # CMake 3.25 leaves these empty for clang: device code would be -O0
cmake --build "$BUILD_DIR" --target revolta_op_tests revolta_bench revolta_gpu_tp_tests revolta_allreduce_bench
cp -a "$TK/lib64/libcudart.so"* "$BUILD_DIR/"

# Resource report: registers, spills and shared memory of every kernel, from the PTX.
: > "$BUILD_DIR/ptxas-report.txt"
for cu in $(find "$ROOT/cuda" -name '*.cu'); do
  clang++-19 -x cuda --cuda-path="$TK" --cuda-gpu-arch=sm_70 --cuda-device-only -S -O3 -std=c++20 \
    -Wno-unknown-cuda-version -I"$ROOT/cpp/src" -I"$ROOT/cuda" -I"$ROOT/cpp/include" -I"$TK/nccl/include" "$cu" \
    -o "$BUILD_DIR/kernel.ptx"
  "$TK/bin/ptxas" -arch=sm_70 -v "$BUILD_DIR/kernel.ptx" -o /dev/null 2>> "$BUILD_DIR/ptxas-report.txt"
done
rm -f "$BUILD_DIR/kernel.ptx"
if grep -E "bytes smem" "$BUILD_DIR/ptxas-report.txt" | awk '{for(i=1;i<=NF;i++) if($(i+1)=="bytes" && $(i+2)=="smem") if ($i+0 > 98304) bad=1} END {exit bad}'; then
  echo "revolta: SM70 lane built in $BUILD_DIR (ptxas report: $BUILD_DIR/ptxas-report.txt)"
else
  echo "revolta: a kernel uses more than 96 KB of shared memory (see ptxas-report.txt)" >&2; exit 1
fi
