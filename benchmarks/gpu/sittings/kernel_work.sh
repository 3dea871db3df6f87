#!/usr/bin/env bash
# The kernel measurements still owed to issue #6, for one GPU, each time-boxed (~9 min
# in all), results under $STATE/results/tuning and $STATE/results/kernels:
#   1. the GPU tests of fp8 decode's early_convert (inline PTX: GPU only);
#   2. the fp8 kernel table: ours, FA3 with an fp8 cache, stock Triton;
#   3. the first fp8 decode retune (sweeps early_convert; writes a table of the fp8
#      keys only: merge its entries into the committed one);
#   4. a prefill sweep of the fp8 keys over fp8_qk and lazy_rescale, and one of the bf16
#      long-prefill buckets over lazy_rescale and 128-row 8-warp tiles capped at 128
#      registers; both into copies of the table (recorded, not installed).
# Usage: STATE=/tmp/some-state BENCH_COMMIT=<sha> [UNTIL=<epoch s>] \
#          bash benchmarks/gpu/sittings/kernel_work.sh
# With UNTIL, no step runs past it (a step with less than 30 s left is skipped).
set -uo pipefail
: "${STATE:?}" "${BENCH_COMMIT:?}"
UNTIL=${UNTIL:-$(($(date +%s) + 1200))}
cd "$(dirname "$0")/../../.."
export TRITON_INTERPRET=0
T=$STATE/results/tuning
mkdir -p "$T"
day=$(date -u +%F)
table=vllm/attention/ops/tuning/prefix_prefill_NVIDIA_H200.json
step() { echo "[kernel-work] $(date -u +%T) $*"; }
# box CAP: the seconds a step may take (CAP, or what is left before UNTIL), or fail.
box() {
  local left=$((UNTIL - $(date +%s) - 5))
  [ "$left" -ge 30 ] || { echo "[kernel-work] ${left}s left: skipped" >&2; return 1; }
  echo $((left < $1 ? left : $1))
}
# The tuner's own budget in minutes for a box of $1 s (it writes its table at the end,
# so it must stop by itself: 45 s are left for the config it is timing and the write).
minutes() { awk -v t="$1" 'BEGIN { printf "%.2f", (t - 45) / 60 }'; }

step "early_convert GPU tests"
t=$(box 120) && timeout "$t" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_paged_decode.py \
  -k early_convert > "$T/early-convert-tests.log" 2>&1
echo "exit $?"; tail -n 2 "$T/early-convert-tests.log"

step "fp8 kernel table"
t=$(box 200) && KB_ARGS="--kernels prefill decode --kv-dtypes fp8 --commit $BENCH_COMMIT" \
  timeout "$t" bash benchmarks/gpu_session.sh kernel-bench

step "fp8 decode retune"
t=$(box 300) && timeout "$t" python3 benchmarks/kernels/bench_kernels.py --stock-site /tmp/site \
  --retune-decode --kernels decode --kv-dtypes fp8 --results-dir "$T" \
  > "$T/retune-decode.log" 2>&1
echo "exit $?"; grep -E "^retune|wrote" "$T/retune-decode.log"

step "fp8 prefill sweep: fp8_qk, lazy_rescale"
cp "$table" "$STATE/fp8-table.json"
t=$(box 200) && timeout "$t" python3 -m vllm.attention.ops.tuning.tune_prefix_prefill --head-sizes 128 \
  --groups 4 --block-sizes 64 --kv-dtypes fp8 --block-m 64 --block-n 64 --num-warps 4 \
  --num-stages 2 3 --use-tma 1 --fp8-qk 0 1 --lazy-rescale 0 1 --budget-minutes "$(minutes "$t")" \
  --out "$STATE/fp8-table.json" --record "$T/$day-$BENCH_COMMIT-prefill-fp8-sweep.json" \
  > "$T/fp8-sweep.log" 2>&1
echo "exit $?"; grep -E "best|->" "$T/fp8-sweep.log" | tail -n 12

step "bf16 prefill sweep: lazy_rescale, 128-row tiles at 128 registers"
cp "$table" "$STATE/bf16-table.json"
t=$(box 200) && timeout "$t" python3 -m vllm.attention.ops.tuning.tune_prefix_prefill --head-sizes 128 \
  --groups 4 --block-sizes 64 --query-lens 1024 4096 16384 --block-m 64 128 \
  --block-n 32 64 --num-warps 4 8 --num-stages 2 --use-tma 1 --maxnreg 0 128 \
  --lazy-rescale 0 1 --budget-minutes "$(minutes "$t")" --out "$STATE/bf16-table.json" \
  --record "$T/$day-$BENCH_COMMIT-prefill-bf16-sweep.json" > "$T/bf16-sweep.log" 2>&1
echo "exit $?"; grep -E "best|->" "$T/bf16-sweep.log" | tail -n 12
cp "$STATE/fp8-table.json" "$STATE/bf16-table.json" "$T/"
step "done"
bash benchmarks/gpu_session.sh collect
