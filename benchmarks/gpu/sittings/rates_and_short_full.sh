#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU:
#   GPU 0: issue #4's workload 5 (request rates below saturation, quick sizes) for
#          sharegpt-like and decode-1k-1k (~10 min), then the same two workloads at the
#          issue's own sizes, saturated (1000 and 256 prompts, ~12 min);
#   GPU 1: workload 5 for random-10k-100 and random-5k-100 (~13 min), then kernel
#          measurements owed to issue #6 (kernel_work.sh: early_convert GPU tests, TMA
#          tiles for the 70B-TP-2 prefill keys, the fp8 kernel table, the fp8 decode
#          retune), as far as the job's time goes.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/rates_and_short_full.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left SERVING_ARGS='--rates $pair --workloads sharegpt-like,decode-1k-1k' bash benchmarks/gpu_session.sh serving-quick; STEP_BUDGET_S=$left SERVING_ARGS='--no-rates $pair --workloads sharegpt-like,decode-1k-1k' bash benchmarks/gpu_session.sh serving-full" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$((job_s * 6 / 10)) SERVING_ARGS='--rates $pair --workloads random-10k-100,random-5k-100' bash benchmarks/gpu_session.sh serving-quick; bash benchmarks/gpu/sittings/kernel_work.sh early-convert group8-tma fp8-table fp8-retune"
