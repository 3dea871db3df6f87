#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md): issue #6's
# offline end-to-end table (sharegpt, long10k, decode at full sizes), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU:
#   GPU 0: an e2e sitting in bf16 (~13 min: two cold engine starts of 200-270 s
#          with both lanes starting at once, two passes of three workloads each);
#   GPU 1: the same with --kv-cache-dtype fp8 (~13 min), then the fp8 greedy agreement
#          (~5 min; due again whenever a tuning table turns on an fp8 path such as
#          fp8_qk or early_convert), boxed by the job's deadline.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/e2e_bf16_and_fp8.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
e2e="E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left $e2e' bash benchmarks/gpu_session.sh e2e-full" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left $e2e --kv-cache-dtype fp8' bash benchmarks/gpu_session.sh e2e-full; AGREE_ARGS='--kv-cache-dtype fp8' AGREE_TAG=-fp8 timeout $left bash benchmarks/gpu_session.sh agreement"
