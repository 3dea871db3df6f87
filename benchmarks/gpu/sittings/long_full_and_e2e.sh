#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU:
#   GPU 0: random-10k-100 at the issue's size (300 prompts, saturated; ~14 min), then
#          the prefill sweeps of kernel_work.sh (fp8_qk, lazy_rescale, 128-row tiles;
#          then head size 256 if time is left);
#   GPU 1: random-5k-100 at the issue's size (500 prompts; ~12 min), then e2e sitting
#          2 (bf16; ~10 min) if the job has time left.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/long_full_and_e2e.sh
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-10k-100' bash benchmarks/gpu_session.sh serving-full; bash benchmarks/gpu/sittings/kernel_work.sh fp8-sweep bf16-sweep head256" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-5k-100' bash benchmarks/gpu_session.sh serving-full; STEP_BUDGET_S=$left E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork' bash benchmarks/gpu_session.sh e2e-full"
