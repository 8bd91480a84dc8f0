#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 / Ubuntu 24.04 machine and builds it.
#   bash scripts/setup.sh            system packages (apt), Python packages (.venv), then `make`
# Safe to run again: it installs only what is missing. Set SETUP_SKIP_BUILD=1 to skip `make`.
# CUDA is optional: with $CUDA_HOME/bin/nvcc (default /usr/local/cuda) the binary gets the GPU path too.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential pkg-config git libyaml-cpp-dev libhdf5-dev libboost-program-options-dev
              nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libopenmpi-dev openmpi-bin libopenblas-dev python3 python3-venv python3-pip)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python side: a virtual environment beside the checkout (plots, summaries, data preparation, tests).
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python3 ]; then
  "$PY" -m venv .venv 2>/dev/null || { /usr/bin/python3 -m venv .venv; }
fi
if ! .venv/bin/python3 -c "import numpy, h5py, matplotlib, tokenizers, pytest, psutil, yaml, safetensors, pyarrow, tqdm, tensorboard" 2>/dev/null; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/python3 -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python3 -m pip install -q -r scripts/requirements.txt
fi

# The CUDA build compiles against cudnn-frontend's C++ headers (header-only; the Makefile's CUDNN_FE_INC is
# the include/ folder its wheel puts into .venv). Only where there is nvcc to build with, and without the
# wheel's dependencies (cutlass-dsl, apache-tvm-ffi: ~600 MB for its Python API, which nothing here uses).
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDNN_FRONTEND="nvidia-cudnn-frontend>=1.0"
if [ -x "$CUDA_HOME/bin/nvcc" ] \
   && [ ! -f "$(.venv/bin/python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/include/cudnn_frontend.h" ]; then
  echo "setup: installing the cudnn-frontend headers into .venv (for the CUDA build)"
  .venv/bin/python3 -m pip install -q --no-deps "$CUDNN_FRONTEND"
fi

if [ "${SETUP_SKIP_BUILD:-0}" != 1 ]; then
  CUDA=0; [ -x "$CUDA_HOME/bin/nvcc" ] && CUDA=1
  echo "setup: building (CUDA=$CUDA)"
  make -j"$(nproc)" CUDA=$CUDA CUDA_HOME="$CUDA_HOME" PY=.venv/bin/python3 all
fi
