#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md): issue #6's
# offline end-to-end table in bf16 on both GPUs (two sittings, each ratio formed on
# its own GPU) with the H200 prefill table committed with this script (128x64
# 4-warp TMA tiles in every bf16 head-128 bucket but group 4's 16, fp8 128x64 with
# fp8_qk), then the kernel tables those tiles are owed:
#   GPU 0: e2e bf16 (~11 min: two cold engine starts of 150-270 s, two passes of
#          three workloads, ~150 s per backend), then the fp8 greedy agreement
#          (~5 min; due: the table runs fp8_qk), then the fp8 kernel table (ours,
#          FA3 with an fp8 cache, stock Triton), as far as the job's time goes;
#   GPU 1: e2e bf16, and once its timed passes have run, 8 requests of each workload
#          under vLLM's torch profiler per backend (GPU time per kernel category:
#          where long10k's last few percent go; ~1 min per backend), then the bf16
#          kernel table (ours, FA3, stock) and the fp8 decode retune, as far as the
#          job's time goes.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/e2e_and_tables.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
e2e="E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork' bash benchmarks/gpu_session.sh e2e-full"
profiled="E2E_ARGS='--backends FLASH_ATTN,TRITON_ATTN-fork --profile-requests 8' bash benchmarks/gpu_session.sh e2e-full"
work=benchmarks/gpu/sittings/kernel_work.sh
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left $e2e; AGREE_ARGS='--kv-cache-dtype fp8' AGREE_TAG=-fp8 timeout $left bash benchmarks/gpu_session.sh agreement; bash $work fp8-table" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left $profiled; bash $work bf16-table fp8-retune"
