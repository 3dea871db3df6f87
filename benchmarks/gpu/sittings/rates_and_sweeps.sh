#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md), FLASH_ATTN and
# the fork on each GPU, every ratio formed on one GPU:
#   GPU 0: issue #4's workload 5 (request rates below saturation, quick sizes) for
#          sharegpt-like and decode-1k-1k (~16 min: per backend a ~160 s start, the
#          saturated pair of each workload, then 8 and 16 req/s over the 200
#          sharegpt-like prompts and 1 req/s over the 64 decode-heavy ones), then the
#          prefill sweeps of kernel_work.sh (fp8_qk and lazy_rescale on the fp8 keys;
#          lazy_rescale and 128-row tiles on the bf16 long buckets);
#   GPU 1: workload 5 for random-10k-100 and random-5k-100 (~17 min: 0.25 req/s over
#          24 prompts and 0.5 req/s over 40), then kernel_work.sh's early_convert GPU
#          tests, TMA tiles for the 70B-TP-2 prefill keys, the fp8 kernel table and
#          the fp8 decode retune, as far as the job's time goes.
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/rates_and_sweeps.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
work=benchmarks/gpu/sittings/kernel_work.sh
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$((job_s * 7 / 10)) SERVING_ARGS='--rates $pair --workloads sharegpt-like,decode-1k-1k' bash benchmarks/gpu_session.sh serving-quick; bash $work fp8-sweep bf16-sweep" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$((job_s * 7 / 10)) SERVING_ARGS='--rates $pair --workloads random-10k-100,random-5k-100' bash benchmarks/gpu_session.sh serving-quick; bash $work early-convert group8-tma fp8-table fp8-retune"
