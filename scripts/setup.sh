#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 / Ubuntu 24.04 machine and builds it.
#   bash scripts/setup.sh            system packages (apt), Python packages (.venv), then `make`
# Safe to run again: it installs only what is missing. Set SETUP_SKIP_BUILD=1 to skip `make`.
# CUDA is optional: with /usr/local/cuda/bin/nvcc present the binary gets the GPU path too.
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

# Python side: a virtual environment beside the checkout (plots, summaries, data preparation, tests,
# and the cudnn-frontend headers the CUDA build compiles against).
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python3 ]; then
  "$PY" -m venv .venv 2>/dev/null || { /usr/bin/python3 -m venv .venv; }
fi
if ! .venv/bin/python3 -c "import numpy, h5py, matplotlib, tokenizers, pytest, psutil, yaml, safetensors, pyarrow, tqdm, tensorboard" 2>/dev/null \
   || [ ! -f "$(.venv/bin/python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/include/cudnn_frontend.h" ]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/python3 -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python3 -m pip install -q -r scripts/requirements.txt
fi

if [ "${SETUP_SKIP_BUILD:-0}" != 1 ]; then
  CUDA=0; [ -x /usr/local/cuda/bin/nvcc ] && CUDA=1
  echo "setup: building (CUDA=$CUDA)"
  make -j"$(nproc)" CUDA=$CUDA PY=.venv/bin/python3 all
fi
