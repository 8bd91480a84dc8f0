#!/usr/bin/env bash
# Development build of the CUDA sources and the GPU op test into .devbuild/ (the Makefile is the real
# build; this script exists so the CUDA side can be built and shipped to a GPU machine on its own).
#   kernels/build_dev.sh           objects + .devbuild/test_gpu_ops
# Objects are rebuilt when their source or any header is newer. Link: static cudart, shared cuBLASLt,
# cuDNN, NCCL and NVRTC (cudnn-frontend calls it for runtime-compiled engines), and the CPU backend with OpenBLAS linked statically (the GPU machine may lack it).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FE=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/include
OUT=.devbuild
mkdir -p "$OUT"
NVFLAGS="-std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -Isrc -I$FE -diag-suppress 128,2810 -Xcompiler -fopenmp"
newest_header=$(ls -t kernels/*.cuh src/*.hpp src/cuda/*.cuh | head -1)

build() {  # src obj
  if [[ ! -f $2 || $1 -nt $2 || $newest_header -nt $2 ]]; then
    echo "nvcc $1"
    $NVCC $NVFLAGS -c "$1" -o "$2"
  fi
}
export -f build
export NVCC NVFLAGS newest_header
objs=()
for f in kernels/*.cu src/cuda/*.cu; do
  objs+=("$OUT/$(basename "${f%.cu}").o")
  echo "$f $OUT/$(basename "${f%.cu}").o"
done | xargs -P "${JOBS:-2}" -n 2 bash -c 'build "$0" "$1"'

for f in src/backend_cpu.cpp src/common.cpp tests/gpu/test_ops.cpp; do
  o=$OUT/$(basename "${f%.cpp}").o
  if [[ ! -f $o || $f -nt $o || $newest_header -nt $o ]]; then
    echo "g++ $f"
    g++ -std=c++17 -O2 -fopenmp -Isrc -I/usr/local/cuda/include -c "$f" -o "$o"
  fi
done
objs=()
for f in kernels/*.cu src/cuda/*.cu; do objs+=("$OUT/$(basename "${f%.cu}").o"); done
$NVCC -o "$OUT/test_gpu_ops" "$OUT/test_ops.o" "$OUT/backend_cpu.o" "$OUT/common.o" "${objs[@]}" \
  -L/usr/local/cuda/lib64 -lcublasLt -lcudnn -lnccl -lnvrtc \
  -Xlinker -Bstatic -lopenblas -Xlinker -Bdynamic -lgfortran -lgomp -lpthread
echo "built $OUT/test_gpu_ops"
