#!/usr/bin/env bash
# Kernel test suite on the GPU host (no vLLM needed), time-boxed to fit one device call.
# usage: bash benchmarks/gpu/kernel_tests.sh OUTDIR [SECONDS_FOR_FULL_MATRIX]
# Writes OUTDIR/env.json, junit XML and logs; benchmarks/gpu/junit_to_json.py turns them
# into benchmarks/results/gpu-tests/<date>-<commit>.json.
set -u
out=${1:?usage: kernel_tests.sh OUTDIR [SECONDS]}
full_s=${2:-330}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
python3 - "$out/env.json" <<'PY'
import json, subprocess, sys, torch, triton
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().split(", ")
json.dump({"gpu": torch.cuda.get_device_name(), "driver": smi[-1], "torch": torch.__version__,
           "triton": triton.__version__}, open(sys.argv[1], "w"))
PY
python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels --junitxml="$out/junit-sampled.xml" \
  > "$out/sampled.log" 2>&1; tail -n 25 "$out/sampled.log"
GPU_FULL=1 timeout "$full_s" python3 -m pytest -q -n 8 -p no:cacheprovider -m full_matrix \
  tests/kernels --junitxml="$out/junit-full.xml" > "$out/full.log" 2>&1
echo "full-matrix exit: $?"; tail -n 25 "$out/full.log"
