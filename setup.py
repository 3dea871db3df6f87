"""Build, install and patch the vLLM TritonAttn fork (pinned vLLM + our backend).

`pip install .` installs the fork: the pinned upstream vLLM wheel repackaged with
our overlay (`vllm/`) and the anchored edits (`envs_patch/`); the PEP 517 backend is
`fork_build.backend` (see pyproject.toml). This file is the command line for the
rest; importing it does nothing. Commands:

    python setup.py wheel [--out dist] [--upstream-wheel PATH]
        the fork's wheel, same as `pip wheel . --no-deps -w dist`
    python setup.py patch --site-packages DIR [--revert | --status]
        patch an installed stock vLLM (the pinned release) in place, offline
    python setup.py pr-patch [--out FILE] [--upstream-sdist PATH]
        the upstream PR as a git-format patch against the pristine vLLM sdist
    python setup.py source-tree [--out build] [--upstream-sdist PATH]
        the patched upstream source tree, for source builds (ROCm: docs/rocm.md)
    python setup.py fetch | show
        fill the download cache / list what the fork changes

Upstream files come from --upstream-wheel/--upstream-sdist, TRITONATTN_UPSTREAM_WHEEL/
TRITONATTN_UPSTREAM_SDIST, the cache ~/.cache/vllm-tritonattn or PyPI, always checked
against the sha256 pinned in fork_build/pins.py. Details: docs/install.md.
"""

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fork_build.cli import main

    sys.exit(main())
