#!/usr/bin/env bash
# Everything that needs a GPU, in one go: kernel and whole-step tests, the GPU end-to-end tests, the
# throughput benchmark against PyTorch and the checkpoint throughput of GPT-2 1558M; optionally the ZeRO
# sweeps on 1, 2, 4 and 8 GPUs (as many as there are) with their scaling table.
#   OUT=gpu_out bash bench/gpu_suite.sh [tests|bench|ckpt|scaling]...     (default: tests bench ckpt)
# Expects ./train, build/tests/gpu/test_*, build/bench/gemm_algos and build/bench/attention_plans built
# (make), python3 with h5py, pytest and torch.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
parts=${*:-tests bench ckpt}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ >> "$OUT/gpu.txt"

if [[ $parts == *tests* ]]; then
  for t in build/tests/gpu/test_*; do
    echo "== $t"
    timeout 300 "$t" > "$OUT/$(basename "$t").log" 2>&1
    echo "exit $?: $(tail -n 1 "$OUT/$(basename "$t").log")"
  done
  grep -E "FAIL" "$OUT"/test_*.log | head -20
  timeout 400 python3 -m pytest -q -rs tests/integration/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 5
  # ZeRO equivalence on 2 GPUs (skips itself, with a message, on fewer)
  timeout 300 python3 -m pytest -q -rs tests/integration/test_gpu_zero.py 2>&1 | tee "$OUT/pytest_gpu_zero.log" | tail -n 5
fi
if [[ $parts == *bench* ]]; then
  timeout 420 python3 bench/gpu_bench.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tail -n 12
  # cuBLASLt's algorithms for every product of the step, against the trainer's choice, in short runs
  # and (the top 5) run for 150 ms each at the power limit
  timeout 400 build/bench/gemm_algos --sustain 150 --json "$OUT/gemm_algos.json" 2>&1 | tee "$OUT/gemm_algos.txt" | tail -n 6
  # cuDNN's attention plans (knobs included) against the heuristic's first, which the trainer runs
  timeout 200 build/bench/attention_plans --knobs --json "$OUT/attention_plans.json" 2>&1 | tee "$OUT/attention_plans.txt" | tail -n 6
fi
if [[ $parts == *ckpt* ]]; then
  # 1558M checkpoint: write at step 2, then a resumed run reads it; the trainer prints size, time, GB/s
  cat > "$OUT/ckpt.yaml" <<YAML
run: {name: ckpt, out_dir: /tmp/ckpt_bench}
model: {preset: d48}
data: {synthetic: true, synthetic_vocab: 50257}
training: {device: cuda, micro_batch: 4, seq_len: 1024, steps: 2}
eval: {batches: 0}
log: {every: 1, progress: false}
checkpoint: {every: 2, keep_last: 1}
YAML
  rm -rf /tmp/ckpt_bench
  timeout 240 ./train --yaml "$OUT/ckpt.yaml" 2>&1 | grep -E "checkpoint written|error" | tee "$OUT/ckpt.txt"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  timeout 240 ./train --yaml "$OUT/ckpt.yaml" --set training.steps=3 --resume 2>&1 | grep -E "resumed|error" | tee -a "$OUT/ckpt.txt"
  rm -rf /tmp/ckpt_bench
fi
if [[ $parts == *scaling* ]]; then
  # the same sweeps at each GPU count this host has, then efficiency against 1 GPU
  gpus=$(nvidia-smi -L | wc -l)
  MPI="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
  for w in 1 2 4 8; do
    (( w <= gpus )) || break
    timeout 900 $MPI -np $w ./train --yaml experiments/zero.yaml --set run.out_dir="$OUT/runs" \
      --set run.name=zero_${w}gpu > "$OUT/zero_${w}gpu.log" 2>&1
    timeout 900 $MPI -np $w ./train --yaml experiments/zero_max.yaml --set run.out_dir="$OUT/runs" \
      --set run.name=zmax_${w}gpu > "$OUT/zmax_${w}gpu.log" 2>&1
    tail -n 1 "$OUT/zero_${w}gpu.log" "$OUT/zmax_${w}gpu.log"
  done
  python3 scripts/plot_scaling.py "$OUT"/runs/zero_*gpu -o "$OUT" --markdown | tee "$OUT/scaling.md"
  for d in "$OUT"/runs/zmax_*gpu; do python3 scripts/summarize.py "$d" --markdown; done | tee "$OUT/zero_max.md"
fi
