#!/usr/bin/env bash
# A relocatable copy of the built binaries, for a GPU node that has the NVIDIA driver, the CUDA libraries
# (cuBLASLt, cuDNN, NCCL) and OpenMPI but not this project's build dependencies. ./train, the GPU test
# programs and the cuBLASLt and cuDNN surveys are relinked from the objects `make` built, with the Makefile's own
# flags except that OpenBLAS is linked in statically, and host debug information is stripped; the shared
# libraries that a CUDA + MPI image may lack (yaml-cpp, Boost.Program_options, HDF5, the GCC runtimes) are
# copied into DIR/lib. DIR must not exist yet; it appears whole or not at all.
#   make && bash scripts/bundle.sh DIR
#   on the node: LD_LIBRARY_PATH=DIR/lib:<CUDA, cuDNN, NCCL lib dirs> DIR/train --yaml ...
set -euo pipefail
OUT=$(realpath -m "${1:?usage: scripts/bundle.sh DIR}")
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
[[ -f $BUILD/cli/main.o && -d $BUILD/cu ]] || { echo "bundle: no CUDA build in $BUILD (run make first)" >&2; exit 1; }
[[ ! -e $OUT ]] || { echo "bundle: $OUT exists (remove it or name another folder)" >&2; exit 1; }

# the Makefile's variables, split into words as its recipes' shell would
PY=${PY:-$([[ -x .venv/bin/python3 ]] && echo .venv/bin/python3 || echo python3)}
mk() { make -s --no-print-directory PY="$PY" BUILD="$BUILD" "print-$1"; }
eval "cxx=($(mk CXX)) cppflags=($(mk CPPFLAGS)) cxxflags=($(mk CXXFLAGS)) ldlibs=($(mk LDLIBS))"
eval "objs=($(mk CORE_OBJ) $(mk CU_OBJ)) testlibs=($(mk TEST_LIBS))"
libs=()
for l in "${ldlibs[@]}"; do
  if [[ $l == -lopenblas ]]; then libs+=(-Wl,-Bstatic -lopenblas -Wl,-Bdynamic -lgfortran); else libs+=("$l"); fi
done

mkdir -p "$(dirname "$OUT")"
tmp=$(mktemp -d "$(dirname "$OUT")/.bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/lib"
link() {  # output name, inputs... (GoogleTest linked in statically for the test programs)
  local name=$1 extra=()
  shift
  [[ $name == test_* ]] && extra=("${testlibs[@]}")
  "${cxx[@]}" "${cppflags[@]}" -Itests "${cxxflags[@]}" -o "$tmp/$name" "$@" "${objs[@]}" "${extra[@]}" "${libs[@]}"
  strip --strip-debug "$tmp/$name"
  echo "bundle: $name ($(du -h "$tmp/$name" | cut -f1))"
}
link train "$BUILD/cli/main.o"
for t in tests/gpu/test_*.cpp; do link "$(basename "${t%.cpp}")" "$t"; done
for b in gemm_algos attention_plans attention_fp8 host_pinning; do
  if [[ -f $BUILD/cu/bench/$b.o ]]; then link "$b" "$BUILD/cu/bench/$b.o"; fi
done

# the non-system libraries the binaries load, by soname, resolved here
pattern='yaml-cpp|boost_program_options|xxhash|hdf5|libsz|libaec|gfortran|quadmath|gomp'
for so in $(ldd "$tmp/train" | awk -v p="$pattern" '$1 ~ p {print $3}'); do cp -L "$so" "$tmp/lib/"; done
mv "$tmp" "$OUT"
trap - EXIT
echo "bundle: $OUT, with $(ls "$OUT/lib" | tr '\n' ' ')"
