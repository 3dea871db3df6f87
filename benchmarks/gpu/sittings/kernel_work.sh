#!/usr/bin/env bash
# The kernel measurements still owed to issue #6, for one GPU, each step boxed by a
# deadline; results under $STATE/results/tuning and $STATE/results/kernels. Steps, in
# the order given (default: all, in this order):
#   early-convert  the GPU tests of fp8 decode's early_convert (inline PTX: GPU only)
#   fast-exp       the GPU tests of prefill's fast_exp (inline PTX: GPU only)
#   group8-tma     a prefill sweep of the Llama-3.1-70B-at-TP-2 keys (head 128, group
#                  8, page 64; their table entries predate TMA) over TMA tiles, long
#                  buckets only
#   fp8-table      the fp8 kernel table: ours, FA3 with an fp8 cache, stock Triton
#   fp8-retune     the first fp8 decode retune (sweeps early_convert; writes a table of
#                  the fp8 keys only: merge its entries into the committed one)
#   fp8-sweep      a prefill sweep of the fp8 keys over fp8_qk and lazy_rescale
#   bf16-sweep     a sweep of the bf16 long-prefill buckets over lazy_rescale and
#                  128-row 8-warp tiles capped at 128 registers
#   head256        the head-size-256 keys (Gemma-2-9B: group 2) that 85516c0's sweep
#                  left on the heuristic's 64x32 4-warp tile (buckets 16, 64 and
#                  16384; 256, 1k and 4k took 128x64 8-warp TMA, +30%)
#   bf16-table     the bf16 kernel table (ours, FA3, stock Triton) with the table's
#                  128x64 4-warp TMA prefill tiles (e5b6df6's sweeps)
#   fp8-tiles      the fp8 keys' long buckets over 128- and 256-row tiles with fp8_qk,
#                  with and without fast_exp (the fp8 sweep of e5b6df6 had only 64x64
#                  tiles; 128x64 4-warp won bf16)
#   short-tiles    the bf16 short buckets (16, 64, 256; groups 4 and 8) over the TMA
#                  tiles, 128-row 4-warp ones included
#   m256           the bf16 long buckets (groups 4 and 8) over 256-row 8-warp TMA tiles
#                  (two warpgroups of 128 rows sharing each K/V tile, one program per
#                  SM; sm_90 build: 255 registers, 200-byte stack with 64-key tiles)
#                  against the 128-row ones, each with and without fast_exp (fp16
#                  exponentials, two per instruction)
# The sweeps write into copies of the H200 table (recorded, not installed: merge an
# entry only together with its record).
# Usage: STATE=/tmp/some-state BENCH_COMMIT=<sha> [UNTIL=<epoch s>] \
#          bash benchmarks/gpu/sittings/kernel_work.sh [STEP ...]
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
# The tuner's own budget in minutes for a box of $1 s. It writes its table at the end
# and looks at its budget only between keys, so it must stop early enough for the key
# it is tuning (up to ~60 s) and the write: 90 s are left for those.
minutes() { awk -v t="$1" 'BEGIN { printf "%.2f", (t - 90) / 60 }'; }
# sweep NAME CAP ARGS...: the prefill tuner into a copy of the table, recorded.
sweep() {
  local name=$1 cap=$2 t
  shift 2
  cp "$table" "$STATE/$name-table.json"
  t=$(box "$cap") || return 0
  timeout "$t" python3 -m vllm.attention.ops.tuning.tune_prefix_prefill "$@" \
    --budget-minutes "$(minutes "$t")" --out "$STATE/$name-table.json" \
    --record "$T/$day-$BENCH_COMMIT-prefill-$name.json" > "$T/$name.log" 2>&1
  echo "exit $?"; grep -E -- "->|budget" "$T/$name.log" | tail -n 12
  cp "$STATE/$name-table.json" "$T/"
}

# gpu_tests NAME FILE EXPR: the kernel tests of tests/kernels/FILE matching EXPR
# (inline PTX: they run on the GPU only), within 120 s.
gpu_tests() {
  local t
  t=$(box 120) || return 0
  timeout "$t" python3 -m pytest -q -p no:cacheprovider "tests/kernels/$2" -k "$3" \
    > "$T/$1-tests.log" 2>&1
  echo "exit $?"; tail -n 2 "$T/$1-tests.log"
}

for s in "${@:-early-convert group8-tma fp8-table fp8-retune fp8-sweep bf16-sweep head256 bf16-table fp8-tiles short-tiles m256 fast-exp}"; do
  for name in $s; do
    step "$name"
    case $name in
      early-convert) gpu_tests early-convert test_paged_decode.py early_convert ;;
      fast-exp) gpu_tests fast-exp test_prefix_prefill.py fast_exp ;;
      group8-tma)
        sweep group8-tma 240 --head-sizes 128 --groups 8 --block-sizes 64 \
          --query-lens 1024 4096 16384 --use-tma 1 --block-m 64 128 --block-n 32 64 \
          --num-warps 4 8 --num-stages 2 3 ;;
      fp8-table)
        t=$(box 200) && KB_ARGS="--kernels prefill decode --kv-dtypes fp8 --commit $BENCH_COMMIT" \
          timeout "$t" bash benchmarks/gpu_session.sh kernel-bench ;;
      fp8-retune)
        # One key took ~5 min at e5b6df6 with every config on every point; now all
        # 54 on the heaviest point, then 6 finalists and the current config on all.
        t=$(box 660) && timeout "$t" python3 benchmarks/kernels/bench_kernels.py \
          --stock-site /tmp/site --retune-decode --kernels decode --kv-dtypes fp8 \
          --results-dir "$T" > "$T/retune-decode.log" 2>&1
        echo "exit $?"; grep -E "^retune|wrote" "$T/retune-decode.log" ;;
      fp8-sweep)
        sweep fp8 240 --head-sizes 128 --groups 4 --block-sizes 64 --kv-dtypes fp8 \
          --block-m 64 --block-n 64 --num-warps 4 --num-stages 2 3 --use-tma 1 \
          --fp8-qk 0 1 --lazy-rescale 0 1 ;;
      bf16-sweep)
        sweep bf16 240 --head-sizes 128 --groups 4 --block-sizes 64 \
          --query-lens 1024 4096 16384 --block-m 64 128 --block-n 32 64 \
          --num-warps 4 8 --num-stages 2 --use-tma 1 --maxnreg 0 128 --lazy-rescale 0 1 ;;
      head256)
        sweep head256 240 --head-sizes 256 --groups 2 --block-sizes 64 \
          --query-lens 16 64 16384 --block-m 64 128 --block-n 32 64 \
          --num-warps 4 8 --num-stages 2 --use-tma 0 1 ;;
      bf16-table)
        t=$(box 300) && KB_ARGS="--kernels prefill decode --kv-dtypes bf16 --commit $BENCH_COMMIT" \
          timeout "$t" bash benchmarks/gpu_session.sh kernel-bench ;;
      fp8-tiles)
        sweep fp8-tiles 300 --head-sizes 128 --groups 4 --block-sizes 64 --kv-dtypes fp8 \
          --query-lens 1024 4096 16384 --block-m 64 128 256 --block-n 64 \
          --num-warps 4 8 --num-stages 2 --use-tma 1 --fp8-qk 1 --fast-exp 0 1 ;;
      m256)
        sweep m256 300 --head-sizes 128 --groups 4 8 --block-sizes 64 \
          --query-lens 1024 4096 16384 --block-m 128 256 --block-n 64 \
          --num-warps 4 8 --num-stages 2 --use-tma 1 --fast-exp 0 1 ;;
      short-tiles)
        sweep short-tiles 300 --head-sizes 128 --groups 4 8 --block-sizes 64 \
          --query-lens 16 64 256 --block-m 64 128 --block-n 32 64 --num-warps 4 8 \
          --num-stages 2 3 --use-tma 1 ;;
      *) echo "kernel_work: unknown step $name" >&2; exit 2 ;;
    esac
  done
done
step "done"
bash benchmarks/gpu_session.sh collect
