#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh), trains the quickstart model on the built-in synthetic corpus
# (on the GPU if there is one, else the CPU: a few minutes on 2 cores) and plots its loss.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./train --yaml experiments/quickstart.yaml "$@"
.venv/bin/python3 scripts/plot_runs.py runs/quickstart -o runs/quickstart/loss.png
echo "log: runs/quickstart/log.h5   plot: runs/quickstart/loss.png   checkpoints: runs/quickstart/checkpoints/"
