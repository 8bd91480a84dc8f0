#!/usr/bin/env bash
# A relocatable copy of the built binaries, for a GPU node that has the NVIDIA driver, the CUDA libraries
# (cuBLASLt, cuDNN, NCCL) and OpenMPI but not this project's build dependencies. ./train, the GPU test
# programs and the cuBLASLt survey are relinked from the objects `make` built, with OpenBLAS linked in
# statically and host debug information stripped; the shared libraries that a CUDA + MPI image may lack
# (yaml-cpp, Boost.Program_options, HDF5, the GCC runtimes) are copied into DIR/lib.
#   make && bash scripts/bundle.sh DIR
#   on the node: LD_LIBRARY_PATH=DIR/lib:<CUDA, cuDNN, NCCL lib dirs> DIR/train --yaml ...
set -euo pipefail
OUT=$(realpath -m "${1:?usage: scripts/bundle.sh DIR}")
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
HDF5_PC=$(pkg-config --exists hdf5-serial && echo hdf5-serial || echo hdf5)
[[ -f $BUILD/main.o && -d $BUILD/cu ]] || { echo "bundle: no CUDA build in $BUILD (run make first)" >&2; exit 1; }

mkdir -p "$OUT/lib"
core=()
for o in "$BUILD"/*.o; do
  case $(basename "$o") in main.o | cuda_stub.o) ;; *) core+=("$o") ;; esac
done
mapfile -t cu < <(find "$BUILD/cu/kernels" "$BUILD/cu/src" -name '*.o' | sort)
libs=($(pkg-config --libs yaml-cpp "$HDF5_PC") -lboost_program_options -Wl,-Bstatic -lopenblas -Wl,-Bdynamic
      -lgfortran -lgomp -lpthread -L"$CUDA_HOME/lib64" -lcudart -lcublasLt -lcublas -lcudnn -lnccl -lnvrtc)
flags=(-O3 -std=c++17 -fopenmp -Isrc -Itests -DOMPI_SKIP_MPICXX=1 $(pkg-config --cflags yaml-cpp "$HDF5_PC"))

link() {  # output, inputs...
  local out=$1
  shift
  mpicxx "${flags[@]}" -o "$out" "$@" "${core[@]}" "${cu[@]}" "${libs[@]}"
  strip --strip-debug "$out"
  echo "bundle: $out ($(du -h "$out" | cut -f1))"
}
link "$OUT/train" "$BUILD/main.o"
for t in tests/gpu/test_*.cpp; do link "$OUT/$(basename "${t%.cpp}")" "$t"; done
[[ -f $BUILD/cu/bench/gemm_algos.o ]] && link "$OUT/gemm_algos" "$BUILD/cu/bench/gemm_algos.o"

# the non-system libraries the binaries load, by soname, resolved here
for so in $(ldd "$OUT/train" | awk '/yaml-cpp|boost_program_options|hdf5|libsz|libaec|gfortran|quadmath|gomp/ {print $3}'); do
  cp -L "$so" "$OUT/lib/"
done
echo "bundle: $(ls "$OUT/lib" | tr '\n' ' ')"
