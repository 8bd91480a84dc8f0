#!/usr/bin/env bash
# Everything that needs a GPU, in one go: kernel and whole-step tests, the GPU end-to-end tests, the
# throughput benchmark against PyTorch and the checkpoint throughput of GPT-2 1558M; optionally the ZeRO
# sweeps on 1, 2, 4 and 8 GPUs (as many as there are) with their scaling table; optionally FP8 against bf16
# on both sides (this trainer's training.precision fp8, torchao's float8 training in PyTorch).
#   OUT=gpu_out bash bench/gpu_suite.sh [tests|bench|ckpt|scaling|fp8]...     (default: tests bench ckpt)
# Expects ./train, build/tests/gpu/test_*, build/bench/gemm_algos and build/bench/attention_plans built
# (make), python3 with h5py, pytest and torch; fp8 also torchao, installed from the wheels in .whl/ where
# that folder exists (bring it along: it is not tracked).
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
  timeout 400 python3 -m pytest -q -rs tests/integration/test_gpu.py tests/integration/test_hf.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 5
  # ZeRO equivalence on 2 GPUs (skips itself, with a message, on fewer)
  timeout 300 python3 -m pytest -q -rs tests/integration/test_gpu_zero.py 2>&1 | tee "$OUT/pytest_gpu_zero.log" | tail -n 5
fi
if [[ $parts == *bench* ]]; then
  timeout 420 python3 bench/gpu_bench.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tail -n 12
  if [[ ${SURVEYS:-1} == 1 ]]; then  # SURVEYS=0 leaves them out
    # cuBLASLt's algorithms for every product of the step, against the trainer's choice, in short runs
    # and (the top 5) run for 150 ms each at the power limit
    timeout 400 build/bench/gemm_algos --sustain 150 --json "$OUT/gemm_algos.json" 2>&1 | tee "$OUT/gemm_algos.txt" | tail -n 6
    # cuDNN's attention plans (knobs included) against the heuristic's first, which the trainer runs
    timeout 200 build/bench/attention_plans --knobs --json "$OUT/attention_plans.json" 2>&1 | tee "$OUT/attention_plans.txt" | tail -n 6
  fi
fi
if [[ $parts == *ckpt* ]]; then
  # GPT-2 1558M, micro-batch 16, a checkpoint every 20 steps written in the background: the step times
  # around it (log.h5: the pause and the slower steps after it) and the write's own figures; then raw dd
  # against ./train's write and read (CKPT_THREADS: checkpoint.threads, default 4)
  CK=${CKPT_DIR:-/tmp/ckpt_bench}
  cat > "$OUT/ckpt.yaml" <<YAML
run: {name: async, out_dir: $CK}
model: {preset: d48}
data: {synthetic: true, synthetic_vocab: 50257}
training: {device: cuda, micro_batch: 16, seq_len: 1024, steps: ${CKPT_STEPS:-25}}
eval: {batches: 0}
log: {every: 1, progress: false}
checkpoint: {every: 20, keep_last: 1, threads: ${CKPT_THREADS:-4}}
YAML
  rm -rf "$CK"; df -h "$(dirname "$CK")" | tail -1 | tee "$OUT/disk.txt"
  # peak host memory: GNU time where installed, else the same line from Python's getrusage
  timev=(python3 -c 'import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); print("Maximum resident set size (kbytes):", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)')
  [[ -x /usr/bin/time ]] && timev=(/usr/bin/time -v)
  "${timev[@]}" timeout 400 ./train --yaml "$OUT/ckpt.yaml" > "$OUT/ckpt_run.txt" 2> "$OUT/ckpt_time.txt"
  grep -E "^step +(1[89]|2[0-3])/|checkpoint|set-up|error|warning" "$OUT/ckpt_run.txt" | tee "$OUT/ckpt.txt"
  grep -E "Maximum resident|Elapsed" "$OUT/ckpt_time.txt" | tee -a "$OUT/ckpt.txt"
  python3 - "$CK/async/log.h5" <<'PY' | tee -a "$OUT/ckpt.txt"
import h5py, sys, numpy as np
f = h5py.File(sys.argv[1], "r")
ms = f["train/step_ms"][:]
steps = f["train/step"][:]
el = f["train/elapsed_s"][:]
normal = np.median(ms[(steps > 2) & ((steps < 20) | (steps > 23))])
i = int(np.nonzero(steps == 21)[0][0])
# the pause between steps 20 and 21 (queueing the copies, laying the file out), then how much longer the
# next steps took (the update waits on the device for copies still running); the target is one step
pause = (el[i] - el[i - 1]) * 1000 - ms[i]
slower = [ms[j] - normal for j in range(i, min(i + 3, len(ms)))]
held = pause + sum(max(0.0, x) for x in slower)
print(f"median step {normal:.1f} ms; steps 21-23 {', '.join(f'{ms[j]:.1f}' for j in range(i, min(i + 3, len(ms))))} ms; "
      f"the checkpoint at step 20 held training {held:.1f} ms (pause {pause:.1f} ms + slower steps "
      f"{sum(max(0.0, x) for x in slower):.1f} ms) = {held / normal:.2f} steps")
print("message:", f.attrs.get("message"))
print("peak GPU bytes", dict(f["memory/measured"].attrs).get("peak"))
PY
  rm -rf "$CK"
  CK=${CKPT_IO_DIR:-$CK}
  timeout 500 python3 bench/checkpoint_io.py --dir "$CK" --out "$OUT/checkpoint_io.json" --yaml "$OUT/ckpt.yaml" \
    --set training.steps=1 --raw-gb ${RAW_GB:-16} --streams ${CKPT_THREADS:-4} 2>&1 | tail -n 12
  rm -rf "$CK"
fi
if [[ $parts == *fp8* ]]; then
  # GPT-2 124M and 1558M: this trainer bf16, fp8 and fp8 with the op profile, then PyTorch bf16 and its two
  # torchao recipes, all in one gpu_bench invocation. Back in $OUT: fp8_results.{md,json}, the fp8 op
  # profiles in one file and everything else (logs, YAMLs, PyTorch JSONs, log.h5) in fp8_logs.tar.gz.
  # FP8_CONFIGS picks the models (one model per call keeps a call within ~10 minutes), FP8_TIMEOUT caps the
  # benchmark's seconds, FP8_ARGS adds gpu_bench options.
  if [[ -d .whl ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "import torchao; print('torchao', torchao.__version__)" || echo "torchao missing: the PyTorch fp8 rows will fail"
  FB=/tmp/fp8_bench
  rm -rf "$FB"; mkdir -p "$FB"
  timeout ${FP8_TIMEOUT:-540} python3 bench/gpu_bench.py --out "$FB" --configs ${FP8_CONFIGS:-d12:64,d48:16} \
    --variants 0,0fp8,0fp8prof --torch-fp8 tensorwise,rowwise ${FP8_ARGS:-} > "$FB.txt" 2>&1
  echo "gpu_bench exit $?"; mv "$FB.txt" "$FB/gpu_bench.txt"
  tail -n 14 "$FB/gpu_bench.txt"
  grep -hE "[Ee]rror:" "$FB"/*.log 2>/dev/null | sort | uniq -c | head -n 8  # why a row failed, if one did
  cp "$FB/results.md" "$OUT/fp8_results.md"; cp "$FB/results.json" "$OUT/fp8_results.json"
  for f in "$FB"/op_profile_*.txt; do [[ -e $f ]] && { echo "== $(basename "$f")"; cat "$f"; }; done > "$OUT/fp8_op_profiles.txt"
  tar -czf "$OUT/fp8_logs.tar.gz" -C "$FB" --exclude=results.md --exclude=results.json .
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
