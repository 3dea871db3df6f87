#!/usr/bin/env bash
# Sitting (nvidia-h200-x2, one detached job; benchmarks/gpu/README.md): issue #4's
# workload 5 (request rates below saturation, quick sizes), FLASH_ATTN and the fork on
# each GPU, every ratio formed on one GPU:
#   GPU 0: sharegpt-like (8 and 16 req/s over the 200 prompts) and decode-1k-1k
#          (1 req/s over 64), after each workload's saturated pair;
#   GPU 1: random-10k-100 (0.25 req/s over 24 prompts) and random-5k-100 (0.5 req/s
#          over 40).
# Time per backend, from e5b6df6's attempt (both lanes starting servers at once): a
# 200-270 s start, ~30 s per `vllm bench serve` besides its own duration, and the
# passes themselves (GPU 0 ~140 s, GPU 1 ~210 s): ~610 s and ~650 s, so both backends
# need the whole job (that attempt also gave each rate an untimed pass of its own and
# left the lanes 70% of the job: FLASH_ATTN alone used it up).
# Usage: BENCH_COMMIT=<sha> [JOB_S=1600] bash benchmarks/gpu/sittings/rates.sh
# Everything ends within JOB_S seconds (job_common.sh).
set -uo pipefail
# shellcheck source=job_common.sh
source "$(dirname "$0")/job_common.sh"
quick="bash benchmarks/gpu_session.sh serving-quick"
bash benchmarks/gpu/two_lanes.sh \
  "export STATE=$root/bs-lane0; STEP_BUDGET_S=$left SERVING_ARGS='--rates $pair --workloads sharegpt-like,decode-1k-1k' $quick" \
  "export STATE=$root/bs-lane1; STEP_BUDGET_S=$left SERVING_ARGS='--rates $pair --workloads random-10k-100,random-5k-100' $quick"
