#!/usr/bin/env bash
# Two single-GPU jobs side by side on a two-GPU host (the nvidia-h200-x2 machine): the
# first on GPU 0, the second on GPU 1, each a shell command line, e.g.
#
#   bash benchmarks/gpu/two_lanes.sh \
#     "AGREE_ARGS='--kv-cache-dtype fp8' AGREE_TAG=-fp8 bash benchmarks/gpu_session.sh agreement" \
#     "AGREE_MODEL=mistral-7b-sw bash benchmarks/gpu_session.sh agreement"
#
# Output goes to $OUT/lane0.log and $OUT/lane1.log; their tails are printed at the end.
# Each job sees LANE (0 or 1): gpu_session.sh names its archives after it, so two lanes
# with their own STATE (e.g. two e2e sittings, one per GPU) do not overwrite each other.
# Exit status: 0 when both jobs exit 0, else 1. GPU indices are in PCI bus order, as
# nvidia-smi counts them (the soak's memory sampler reads nvidia-smi).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: two_lanes.sh 'COMMAND for GPU 0' 'COMMAND for GPU 1'" >&2; exit 2; }
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/gpu-out}
mkdir -p "$OUT"
export CUDA_DEVICE_ORDER=PCI_BUS_ID
pids=()
for lane in 0 1; do
  spec=${*:lane+1:1}
  echo "[lanes] GPU $lane: $spec"
  # Each lane compiles into its own vLLM cache: two engines of one model and config
  # would otherwise write the same torch.compile artifacts at the same time.
  (export CUDA_VISIBLE_DEVICES=$lane LANE=$lane
   export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}-lane$lane
   eval "$spec") > "$OUT/lane$lane.log" 2>&1 &
  pids+=($!)
done
rc=0
for lane in 0 1; do
  wait "${pids[$lane]}"; r=$?
  echo "[lanes] GPU $lane exit $r"; [ "$r" -eq 0 ] || rc=1
done
for lane in 0 1; do echo "== lane $lane (GPU $lane), last lines"; tail -n 30 "$OUT/lane$lane.log"; done
exit "$rc"
