#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md): issue #6's
# offline end-to-end table in bf16 on both GPUs (two sittings, each ratio formed on
# its own GPU) with the 128x64 4-warp TMA prefill tiles of e5b6df6's sweeps, then the
# kernel work those tiles leave:
#   GPU 0: e2e bf16 (~13 min: two cold engine starts of 200-270 s, two passes of
#          three workloads, ~150 s per backend), then the fp8 greedy agreement
#          (~5 min; due: the table turned fp8_qk on), then fast_exp's GPU tests and
#          the sweeps of 256-row 8-warp tiles (with and without fast_exp), of the
#          short buckets and of head size 256, as far as the job's time goes;
#   GPU 1: e2e bf16, then kernel_work.sh's bf16 kernel table (ours, FA3, stock), the
#          fp8 long-bucket sweep over 128-row tiles and the fp8 decode retune, as far
#          as the job's time goes.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/e2e_and_tiles.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
e2e="E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork' bash benchmarks/gpu_session.sh e2e-full"
work=benchmarks/gpu/sittings/kernel_work.sh
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left $e2e; AGREE_ARGS='--kv-cache-dtype fp8' AGREE_TAG=-fp8 timeout $left bash benchmarks/gpu_session.sh agreement; bash $work fast-exp m256 short-tiles head256" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left $e2e; bash $work bf16-table fp8-tiles fp8-retune"
