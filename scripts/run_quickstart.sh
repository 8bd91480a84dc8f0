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
# A quickstart run continued past the YAML's training.steps (`./train --yaml experiments/quickstart.yaml
# training.steps=650 --resume`, as the README shows) is resumed with the steps its log records, not cut back
# to the YAML's (which --resume refuses): run again, it is complete (nothing to do) and is plotted again.
steps=()
if [ -f runs/quickstart/log.h5 ]; then
  logged=$(.venv/bin/python3 - 2>/dev/null <<'EOF'
import h5py, yaml
with h5py.File("runs/quickstart/log.h5", "r") as f:
    text = f.attrs["config_yaml"]
logged = yaml.safe_load(text.decode() if isinstance(text, bytes) else text)["training"]["steps"]
if logged > yaml.safe_load(open("experiments/quickstart.yaml"))["training"]["steps"]:
    print(logged)
EOF
  ) || logged=""  # a log it cannot read: the trainer names what is wrong with it
  if [ -n "$logged" ]; then
    echo "quickstart: runs/quickstart was trained to $logged steps: resuming with training.steps=$logged"
    steps=("training.steps=$logged")
  fi
fi
"$TRAIN" --yaml experiments/quickstart.yaml --resume ${steps[@]+"${steps[@]}"} "$@"
.venv/bin/python3 scripts/plot_runs.py runs/quickstart -o runs/quickstart/loss.png
echo "log: runs/quickstart/log.h5   plot: runs/quickstart/loss.png   checkpoints: runs/quickstart/checkpoints/"
if [ "$cuda_later" = 1 ]; then
  echo "quickstart: now building ./train with the CUDA kernels for the GPU nodes (build/train-cpu works meanwhile)"
  make -j"$JOBS" CUDA=1 PY=.venv/bin/python3 train
  echo "quickstart: ./train built (CPU and CUDA)"
fi
