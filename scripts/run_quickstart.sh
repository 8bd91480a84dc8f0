#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh), builds ./train, trains the quickstart model on the built-in
# synthetic corpus (on the GPU if there is one, else the CPU) and plots its loss.
#   bash scripts/run_quickstart.sh [train arguments, e.g. training.steps=1000]
# Run again, it resumes the run (a finished one: nothing to do) and plots it again.
# With the CUDA toolkit but no GPU (a login node that builds for the GPU nodes), the CUDA kernels take
# most of the build, so the CPU-only binary (build/train-cpu) is built and trains first, and ./train
# with the GPU path is built after it. The toolkit is looked for in CUDA_HOME (default /usr/local/cuda),
# as the Makefile does.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_SKIP_BUILD=1 bash scripts/setup.sh
JOBS=$(nproc)
gpu_here() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
cuda_later=0
if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && ! gpu_here; then
  cuda_later=1
  echo "quickstart: CUDA toolkit but no GPU here: building the CPU-only build/train-cpu first, ./train (with CUDA) after training"
  make -j"$JOBS" CUDA=0 BIN=build/train-cpu build/train-cpu
  TRAIN=build/train-cpu
else
  make -j"$JOBS" PY=.venv/bin/python3 train
  TRAIN=./train
fi
"$TRAIN" --yaml experiments/quickstart.yaml --resume "$@"
.venv/bin/python3 scripts/plot_runs.py runs/quickstart -o runs/quickstart/loss.png
echo "log: runs/quickstart/log.h5   plot: runs/quickstart/loss.png   checkpoints: runs/quickstart/checkpoints/"
if [ "$cuda_later" = 1 ]; then
  echo "quickstart: now building ./train with the CUDA kernels for the GPU nodes (build/train-cpu works meanwhile)"
  make -j"$JOBS" CUDA=1 PY=.venv/bin/python3 train
  echo "quickstart: ./train built (CPU and CUDA)"
fi
