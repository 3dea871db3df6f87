#!/bin/bash
# vLLM's own tests/v1/attention/test_attention_backends.py against the fork's
# TRITON_ATTN, on a GPU. The test files are taken unmodified from the release's
# source (never kept in this repository); conftest.py lays the test's KV cache out
# as the backend declares it (get_kv_cache_shape), as vLLM's model runner does.
#
#   bash benchmarks/upstream_tests/run.sh SOURCE SITE JUNIT_XML
#
# SOURCE: the release's sdist (vllm-X.tar.gz) or an unpacked source tree;
# SITE: a site directory with the fork installed (put first on PYTHONPATH).
# Needs no network: the model configs the tests load are in ./hf
# (Qwen/Qwen3-0.6B: its published config.json; microsoft/Phi-tiny-MoE-instruct
# and google/embeddinggemma-300m: config.json files written here with the models'
# attention dimensions, which are all the tests read: Phi 16 query heads, 4 KV
# heads, head size 128, a window of 2047; EmbeddingGemma 3 query heads, 1 KV head,
# head size 256, a window of 512 (vLLM makes it 257 for bidirectional layers);
# both bf16 as vLLM resolves them).
#
# Selected, TRITON_ATTN only:
#   test_causal_backend_correctness (10 batch shapes x TP 1/2/4 x KV
#     auto/fp8/fp8_e4m3);
#   test_non_causal_backend_correctness (bidirectional decoder batches;
#     conftest.py adds TRITON_ATTN to the list upstream keeps for it);
#   test_sliding_window_backend_correctness (6 batch shapes x TP 1/2/4);
#   test_sliding_window_encoder_backend_correctness (encoder-only attention
#     with a two-sided window, 2 batch shapes x TP 1/2).
# The rest are specific to other backends or not backend-parametrised.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 SOURCE SITE JUNIT_XML" >&2; exit 2; }
SOURCE=$1 SITE=$(realpath "$2") JUNIT=$(realpath -m "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FILES="tests/__init__.py tests/v1/__init__.py tests/v1/attention/test_attention_backends.py tests/v1/attention/utils.py"
if [ -d "$SOURCE" ]; then
  (cd "$SOURCE" && cp --parents $FILES "$WORK/")
else
  top=$(tar tzf "$SOURCE" | head -1 | cut -d/ -f1)
  tar xzf "$SOURCE" -C "$WORK" --strip-components=1 $(for f in $FILES; do echo "$top/$f"; done)
fi
cp "$HERE/conftest.py" "$HERE/pytest.ini" "$WORK/"
cp -r "$HERE/hf" "$WORK/hf"
cd "$WORK"
export HF_HOME=$WORK/hf HF_HUB_CACHE=$WORK/hf/hub HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SEL="test_causal_backend_correctness or test_non_causal_backend_correctness"
SEL="$SEL or test_sliding_window_backend_correctness"
SEL="$SEL or test_sliding_window_encoder_backend_correctness"
PYTHONPATH=$SITE:$WORK python3 -m pytest -q -p no:cacheprovider -rA --confcutdir=. \
  tests/v1/attention/test_attention_backends.py -k "$SEL" --junitxml="$JUNIT"
