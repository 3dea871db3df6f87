#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU: issue #4's saturated workloads
# at the issue's own prompt counts, and e2e sitting 2 of issue #6.
#   GPU 0: random-10k-100 (300 prompts), sharegpt-like (1000) and decode-1k-1k (256)
#          on one server per backend (~20 min: per backend a ~160 s start, two
#          10k passes of ~125 s with the bench's own start, four of ~40 s);
#   GPU 1: random-5k-100 (500 prompts; ~12 min), then e2e sitting 2 in bf16 (~10 min),
#          then kernel_work.sh's sweep of the head-size-256 keys if time is left.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/full_sizes_and_e2e.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
full="bash benchmarks/gpu_session.sh serving-full"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-10k-100,sharegpt-like,decode-1k-1k' $full" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-5k-100' $full; STEP_BUDGET_S=$left E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork' bash benchmarks/gpu_session.sh e2e-full; bash benchmarks/gpu/sittings/kernel_work.sh head256"
