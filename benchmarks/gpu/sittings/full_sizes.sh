#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU: issue #4's saturated workloads
# at the issue's own prompt counts.
#   GPU 0: random-10k-100 (300 prompts), sharegpt-like (1000) and decode-1k-1k (256)
#          on one server per backend (~23 min: per backend a 200-270 s start, two 10k
#          passes of ~95 s, four of 20-30 s, ~30 s of bench start each);
#   GPU 1: random-5k-100 (500 prompts; ~16 min), then kernel_work.sh's sweep of the
#          head-size-256 buckets still on the heuristic, as far as the job's time goes.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/full_sizes.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
full="bash benchmarks/gpu_session.sh serving-full"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-10k-100,sharegpt-like,decode-1k-1k' $full" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads random-5k-100' $full; bash benchmarks/gpu/sittings/kernel_work.sh head256"
