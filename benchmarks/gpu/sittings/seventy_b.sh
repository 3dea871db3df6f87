#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md): the seed PR's
# Llama-3.1-70B runs (random-10k-100 and random-5k-100, quick sizes) at tensor
# parallel 2 over both GPUs, FLASH_ATTN then the fork. A TP-2 start takes ~9 minutes
# (542-552 s at 974141e) and each pass of either workload ~55 s with the bench's own
# start, so both workloads need ~1630 s: more than a job after the bundle can have.
# WORKLOADS picks them (974141e ran random-10k-100 for both backends; its
# random-5k-100 lacks FLASH_ATTN: WORKLOADS=random-5k-100 completes that, ~1350 s).
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] [WORKLOADS=a,b] bash benchmarks/gpu/sittings/seventy_b.sh
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
STATE=$root/bs-70b STEP_BUDGET_S=$((job_s - 40)) \
  SERVING_ARGS="${pair/--startup-timeout-s 600/--startup-timeout-s 1200} --workloads ${WORKLOADS:-random-10k-100,random-5k-100}" \
  bash benchmarks/gpu_session.sh serving-70b
