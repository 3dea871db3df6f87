"""Build machinery of the vLLM TritonAttn fork (not part of the installed package).

The fork is stock vLLM (pinned in `fork_build.pins`) plus

* the overlay: every file under the repository's `vllm/` directory, added to the
  upstream tree or replacing the upstream file of the same path;
* the anchored edits in `envs_patch/` to a few upstream files;
* for installed copies, a regenerated `vllm/_version.py` carrying the fork version.

`fork_build.plan` computes the new file contents once; the wheel builder
(`fork_build.wheel`, also the PEP 517 backend in `fork_build.backend`), the
in-place patcher (`fork_build.site`) and the source-tree / PR-patch writers
(`fork_build.source`) only write them. Only the standard library is used, so all
of this runs from a bare checkout with no network and no pip.
"""


class BuildError(Exception):
    """A user-facing failure: the message says what is wrong and what to do."""
