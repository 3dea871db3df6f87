#!/usr/bin/env bash
# One step of a GPU session on the H200 host, each fitting one device call (<= 9 min).
#
#   bash benchmarks/gpu_session.sh STEP
#
# Steps (in the order a session runs them; each one can be rerun, finished work is kept
# in $STATE and skipped):
#   prefill-tune   GPU prefill kernel tests, then the prefill tuning sweep of
#                  $TUNE_ARGS into $STATE/tuning (+ $OUT/tuning)             (~5 min)
#   fork           /tmp/site-fork = stock copy patched by `setup.py patch`, with the
#                  tables of $STATE/tuning if any; then `setup`              (~40 s)
#   kernel-bench   benchmarks/kernels/bench_kernels.py $KB_ARGS (ours/FA3/stock)
#   setup          model dirs under $MODELS, versions of both installs     (~10 s)
#   train          train a tiny accuracy model (~3 min)                     -> $STATE/accuracy-model
#                  (optional: accuracy otherwise runs the committed benchmarks/accuracy/model)
#                  ($ACC_MODEL_DIR, seed $TRAIN_SEED: two seeds side by side on two GPUs)
#   accuracy       accuracy of FLASH_ATTN, TRITON_ATTN stock, fork: each start of the
#                  tiny model took ~2.5 min on a fresh machine, so one backend or two
#                  per call (rerun to resume)
#   e2e-quick      issue #6 offline throughput, scale 0.25, 4 backends (resume across calls)
#   serving-quick  issue #4 serving benchmark, quick mode, FA + fork         (~5-8 min)
#   e2e-full | serving-full   full sizes, for longer sessions (resume across calls)
#   agreement      greedy agreement, fork TRITON_ATTN vs stock FLASH_ATTN, on
#                  $AGREE_MODEL (llama-3.1-8b; mistral-7b-sw, gemma-2-9b-softcap) with
#                  $AGREE_ARGS (e.g. "--tp 2", "--kv-cache-dtype fp8")     (~5 min;
#                  TP 2 ~10 min: rerun the step, a finished side is reused)
#   soak           issue #5 serving soak of the fork for $SOAK_S seconds (default 420,
#                  one call; a 30-minute soak does not fit a 30-minute device lease)
#   serving-70b    the seed PR's 70B runs (10k/100, 5k/100), quick sizes, TP 2: needs the
#                  nvidia-h200-x2 machine
#   report         docs/performance.md from everything in $STATE/results
#   collect        copy results to $OUT only
#
# Environment: OUT (files that come back; default ./gpu-out), STATE (kept between calls
# while the machine is warm; default /tmp/bench-state), MODELS (/tmp/models),
# BENCH_SITE_STOCK (/tmp/site), BENCH_SITE_FORK (/tmp/site-fork), STEP_BUDGET_S (500),
# and extra arguments per harness: ACC_ARGS, E2E_ARGS (e.g. "--backends
# FLASH_ATTN,TRITON_ATTN-fork" or "--kv-cache-dtype fp8"), SERVING_ARGS.
# Every step ends by packing $STATE/results into $OUT/results.tgz (logs: $OUT/logs.tgz;
# a device call returns at most 8 files): unpack it into benchmarks/results/ of the
# repository (a newly trained $OUT/accuracy-model*.tgz replaces benchmarks/accuracy/model
# only together with the results measured on it), then run
# `python3 benchmarks/report.py` there to regenerate docs/performance.md and the plots.
set -euo pipefail
STEP=${1:?usage: gpu_session.sh prefill-tune|fork|kernel-bench|setup|train|accuracy|e2e-quick|serving-quick|e2e-full|serving-full|agreement|soak|serving-70b|report|collect}
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
STATE=${STATE:-/tmp/bench-state}
MODELS=${MODELS:-/tmp/models}
BUDGET=${STEP_BUDGET_S:-500}
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# CUDA numbers GPUs as nvidia-smi does (the soak samples memory of CUDA_VISIBLE_DEVICES).
export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}
# Tensor parallel on the device hosts: NVLink multicast must stay off there (it can take
# the shared GPUs out of service). vLLM 0.26's default allreduce+RMSNorm fusion picks
# FlashInfer's "mnnvl" workspace, which is built on NVSwitch multicast; in the first TP-2
# sitting it ended in an illegal memory access during CUDA-graph capture. "trtllm" uses
# CUDA IPC buffers instead, and torch symmetric memory is not used at all.
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=${VLLM_FLASHINFER_ALLREDUCE_BACKEND:-trtllm}
export VLLM_ALLREDUCE_USE_SYMM_MEM=${VLLM_ALLREDUCE_USE_SYMM_MEM:-0}
export BENCH_SITE_STOCK=${BENCH_SITE_STOCK:-/tmp/site}
export BENCH_SITE_FORK=${BENCH_SITE_FORK:-/tmp/site-fork}
mkdir -p "$OUT" "$STATE/results" "$MODELS"
cd "$REPO"

# The orchestrators import only the standard library and benchmarks/; each worker gets
# PYTHONPATH set to its own install, so a caller's PYTHONPATH must not leak in.
unset PYTHONPATH

acc_model() {
  if [ -n "${ACC_MODEL_DIR:-}" ]; then echo "$ACC_MODEL_DIR"
  elif [ -f "$STATE/accuracy-model/model.safetensors" ]; then echo "$STATE/accuracy-model"
  elif [ -f "$REPO/benchmarks/accuracy/model/model.safetensors" ]; then
    echo "$REPO/benchmarks/accuracy/model"
  else echo "gpu_session: no tiny model; run the 'train' step first" >&2; exit 2; fi
}

need_model() {
  [ -f "$MODELS/$1/config.json" ] ||
    PYTHONPATH=$BENCH_SITE_STOCK "$PY" -m benchmarks.models "$MODELS" "$1"
}

collect() {
  # A device call returns at most 8 files from $OUT: the results (JSON, plots, work
  # files) and the logs (server/worker output) travel as two archives. Unpack them
  # with `tar xzf results.tgz -C benchmarks/results` (logs.tgz: anywhere outside git).
  # Under benchmarks/gpu/two_lanes.sh the names carry the lane: results-lane0.tgz.
  local lane=${LANE:+-lane$LANE}
  mkdir -p "$OUT"
  # A lane sharing $STATE may be writing a file meanwhile: tar's complaint is a warning
  # here (the next step's archive has the finished file), not the step's failure.
  tar czf "$OUT/results$lane.tgz" -C "$STATE/results" --exclude='*.log' . ||
    echo "gpu_session: WARNING: results archive incomplete (tar exit $?)"
  (cd "$STATE/results" && find . -type f -name '*.log' -print0 |
    tar czf "$OUT/logs$lane.tgz" --null -T -) ||
    echo "gpu_session: WARNING: logs archive incomplete (tar exit $?)"
  echo "gpu_session: results in $OUT/results$lane.tgz -> tar xzf results$lane.tgz -C benchmarks/results (logs: $OUT/logs$lane.tgz)"
}

case "$STEP" in
  prefill-tune)
    export TRITON_INTERPRET=0
    mkdir -p "$OUT/tuning" "$STATE/tuning"
    timeout 150 "$PY" -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_prefix_prefill.py \
      --junitxml="$OUT/tuning/junit-prefill.xml" > "$OUT/tuning/prefill-tests.log" 2>&1
    echo "prefill tests exit $?"; tail -n 3 "$OUT/tuning/prefill-tests.log"
    table=prefix_prefill_NVIDIA_H200.json
    [ -f "$STATE/tuning/$table" ] || cp "vllm/attention/ops/tuning/$table" "$STATE/tuning/"
    # shellcheck disable=SC2086
    "$PY" -m vllm.attention.ops.tuning.tune_prefix_prefill --out "$STATE/tuning/$table" \
      --record "$OUT/tuning/record.json" ${TUNE_ARGS:---head-sizes 128 --groups 4 --budget-minutes 3} \
      > "$OUT/tuning/tune.log" 2>&1 || echo "gpu_session: tuning failed (see tune.log)"
    grep -E "best|->|wrote" "$OUT/tuning/tune.log" | tail -n 40
    cp "$STATE/tuning/$table" "$OUT/tuning/"
    ;;
  fork)
    if ls "$STATE"/tuning/*.json >/dev/null 2>&1; then
      cp "$STATE"/tuning/*.json vllm/attention/ops/tuning/
      echo "gpu_session: fork uses the tables of $STATE/tuning"
    fi
    rm -rf "$BENCH_SITE_FORK"
    cp -r "$BENCH_SITE_STOCK" "$BENCH_SITE_FORK"
    "$PY" setup.py patch --site-packages "$BENCH_SITE_FORK"
    exec bash "$0" setup
    ;;
  kernel-bench)
    mkdir -p "$STATE/results/kernels"
    # shellcheck disable=SC2086
    TRITON_INTERPRET=0 "$PY" benchmarks/kernels/bench_kernels.py --stock-site "$BENCH_SITE_STOCK" \
      --results-dir "$STATE/results/kernels" ${KB_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  setup)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    # tokenizers may live only in the stock install: make the model dirs with it.
    PYTHONPATH=$BENCH_SITE_STOCK "$PY" -m benchmarks.models "$MODELS" llama-3.1-8b \
      llama-3.1-70b mistral-7b-sw gemma-2-9b-softcap
    for site in "$BENCH_SITE_STOCK" "$BENCH_SITE_FORK"; do
      echo "== $site"; PYTHONPATH=$site "$PY" -c \
        "import importlib.metadata as m; print({n: m.version(n) for n in ('torch','triton','vllm','transformers')})" \
        || echo "gpu_session: WARNING no usable install at $site"
    done
    ;;
  train)
    # Needs torch, safetensors and tokenizers only (the stock install has them too).
    model=${ACC_MODEL_DIR:-$STATE/accuracy-model}; seed=${TRAIN_SEED:-1234}
    PYTHONPATH=$BENCH_SITE_STOCK timeout "$BUDGET" "$PY" benchmarks/accuracy/train_tiny.py \
      --out "$model" --seed "$seed" --time-budget-s 170 ${TRAIN_ARGS:-}
    mkdir -p "$STATE/results/accuracy"
    cp "$model/train_log.json" \
      "$STATE/results/accuracy/train-$(date -u +%F)-${BENCH_COMMIT:-unknown}-seed$seed.json"
    tar czf "$OUT/accuracy-model-seed$seed.tgz" -C "$(dirname "$model")" "$(basename "$model")"
    du -sh "$model" "$OUT/accuracy-model-seed$seed.tgz"
    collect
    ;;
  accuracy)
    "$PY" benchmarks/accuracy/eval.py --model-dir "$(acc_model)" \
      --out-dir "$STATE/results/accuracy" --budget-s "$BUDGET" ${ACC_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  e2e-quick|e2e-full)
    need_model llama-3.1-8b
    scale=0.25; [ "$STEP" = e2e-full ] && scale=1
    "$PY" benchmarks/e2e/run_e2e.py --model-dir "$MODELS/llama-3.1-8b" --scale "$scale" \
      --work-dir "$STATE/results/e2e/work" --results-dir "$STATE/results/e2e" \
      --budget-s "$BUDGET" ${E2E_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  serving-quick|serving-full)
    need_model llama-3.1-8b
    mode=--quick; [ "$STEP" = serving-full ] && mode=
    "$PY" benchmarks/serving/run_serving.py $mode --model-dir "$MODELS/llama-3.1-8b" \
      --work-dir "$STATE/results/serving/work" --results-dir "$STATE/results/serving" \
      --budget-s "$BUDGET" ${SERVING_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  agreement)
    m=${AGREE_MODEL:-llama-3.1-8b}
    need_model "$m"
    # Mistral's and Gemma-2's windows are 4096 tokens: prompts up to 8k reach past them.
    len=4096; case "$m" in mistral-*|gemma-*) len=8192 ;; esac
    mkdir -p "$STATE/results/agreement"
    # shellcheck disable=SC2086
    "$PY" -m benchmarks.agreement.agreement --model "$m" --model-dir "$MODELS/$m" --max-model-len "$len" \
      --reference-pythonpath "$BENCH_SITE_STOCK" --backend-pythonpath "$BENCH_SITE_FORK" \
      --work-dir "$STATE/agreement-work/$m${AGREE_TAG:-}" \
      ${AGREE_ARGS:-} --out "$STATE/results/agreement/$(date -u +%F)-${BENCH_COMMIT:-unknown}-$m${AGREE_TAG:-}.json" \
      > "$STATE/results/agreement/$m${AGREE_TAG:-}.log" 2>&1 || rc=$?
    tail -n 25 "$STATE/results/agreement/$m${AGREE_TAG:-}.log"
    collect; exit "${rc:-0}"
    ;;
  soak)
    need_model llama-3.1-8b
    "$PY" benchmarks/soak/run_soak.py --model-dir "$MODELS/llama-3.1-8b" \
      --duration-s "${SOAK_S:-420}" --out-dir "$STATE/results/soak" ${SOAK_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  serving-70b)
    need_model llama-3.1-70b
    "$PY" benchmarks/serving/run_serving.py --quick --model-dir "$MODELS/llama-3.1-70b" \
      --workloads random-10k-100,random-5k-100 --work-dir "$STATE/results/serving/work" \
      --results-dir "$STATE/results/serving" --budget-s "$BUDGET" ${SERVING_ARGS:-} || rc=$?
    collect; exit "${rc:-0}"
    ;;
  report)
    plots=; "$PY" -c "import matplotlib" 2>/dev/null || plots=--no-plots
    "$PY" benchmarks/report.py --results-dir "$STATE/results" \
      --out "$OUT/performance.md" $plots
    collect
    ;;
  collect) collect ;;
  *) echo "gpu_session: unknown step $STEP" >&2; exit 2 ;;
esac
