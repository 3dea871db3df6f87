"""The one place that pins the upstream vLLM release this fork is built on.

Everything else (the wheel build, the in-place patcher, the PR patch and the ROCm
source tree) reads the base version and the file hashes from here. To move the
fork to another vLLM release, change these values and re-check the anchors in
envs_patch/ (the build fails loudly, naming the file and anchor, if one moved).
"""

UPSTREAM_NAME = "vllm"
UPSTREAM_VERSION = "0.26.0"

# The distribution files of vllm==0.26.0 on PyPI, with their sha256 from the index.
UPSTREAM_WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
UPSTREAM_WHEEL_SHA256 = (
    "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de"
)
UPSTREAM_SDIST = "vllm-0.26.0.tar.gz"
UPSTREAM_SDIST_SHA256 = (
    "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502"
)

# PEP 440 local version of the fork: upstream version + our release counter.
# Bump the counter for every release of the fork on the same upstream base.
FORK_LOCAL = "tritonattn.1"
FORK_VERSION = f"{UPSTREAM_VERSION}+{FORK_LOCAL}"
