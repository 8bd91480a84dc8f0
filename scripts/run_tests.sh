#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh) and runs every test: C++ unit tests, the command line end to
# end on the CPU (single rank and MPI ranks), checkpoints, sweeps, a real single-node Slurm, and the
# Python tools. GPU tests run when a CUDA device is present and are skipped with a message otherwise.
#   bash scripts/run_tests.sh [pytest args, e.g. -k zero]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec .venv/bin/python3 -m pytest -v -rs tests "$@"
