"""Command line of setup.py (see its docstring for the commands)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fork_build import BuildError, pins, plan, site, source, upstream, wheel

# The upstream PR targets the newest supported release.
NEWEST = max(pins.SUPPORTED, key=lambda v: tuple(int(p) for p in v.split(".")))


def _wheel(args) -> str:
    target = pins.upstream(args.vllm_version)
    built = wheel.build_wheel(
        upstream.fetch("wheel", target, args.upstream_wheel), args.out, target
    )
    return f"wrote {built}"


def _patch(args) -> str:
    if args.status:
        return site.describe(args.site_packages)
    if args.revert:
        paths = site.revert_site(args.site_packages)
        return f"reverted {len(paths)} files in {args.site_packages} to stock vLLM"
    try:
        paths = site.patch_site(args.site_packages)
    except site.ForkWheelInstalled as e:
        return str(e)  # nothing to do: not an error
    return (
        f"patched {len(paths)} files in {args.site_packages}: "
        f"{site.describe(args.site_packages)} (undo with --revert)"
    )


def _pr_patch(args) -> str:
    target = pins.upstream(args.vllm_version or NEWEST)
    out = args.out or Path("dist") / source.patch_name(target)
    sdist = upstream.fetch("sdist", target, args.upstream_sdist)
    written = source.write_pr_patch(sdist, out, target)
    return f"wrote {written} (apply with `git apply` in a pristine {target.sdist_root})"


def _source_tree(args) -> str:
    target = pins.upstream(args.vllm_version)
    sdist = upstream.fetch("sdist", target, args.upstream_sdist)
    tree = source.write_source_tree(sdist, args.out, target)
    return f"wrote the patched source tree {tree} (build steps: docs/rocm.md)"


def _fetch(args) -> str:
    target = pins.upstream(args.vllm_version)
    paths = [upstream.fetch("wheel", target, args.upstream_wheel)]
    paths.append(upstream.fetch("sdist", target, args.upstream_sdist))
    return "verified: " + ", ".join(str(p) for p in paths)


def _show(args) -> str:
    target = pins.upstream(args.vllm_version)
    lines = [f"fork version: {target.fork_version} (vLLM {target.version} + ours)"]
    lines += [f"overlay: {p}" for p in plan.overlay_files()]
    installed = plan.edited_files(target)
    lines += [f"edited:  {p}" for p in installed]
    lines += [
        f"edited:  {p} (source trees only)"
        for p in plan.edited_files(target, source=True)
        if p not in installed
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python setup.py",
        description="Build and install the vLLM TritonAttn fork (supported vLLM "
        f"releases: {pins.supported_text()}). `pip install .` builds and installs "
        "the wheel.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(func=func)
        return cmd

    def upstream_option(cmd, kind):
        option, env = upstream.KINDS[kind]
        cmd.add_argument(
            option,
            metavar="PATH",
            help=f"local copy of the release's upstream {kind} (else {env}, the "
            f"cache {upstream.cache_dir()}, or a download from PyPI)",
        )

    def version_option(cmd, default=None):
        cmd.add_argument(
            "--vllm-version",
            choices=list(pins.SUPPORTED),
            help=f"the vLLM release to build on (default: {pins.VERSION_ENV}, else "
            f"{pins.DEFAULT_VERSION})"
            if default is None
            else f"the vLLM release to build on (default: {default}, the newest)",
        )

    cmd = add("wheel", _wheel, "build the fork's wheel (like `pip wheel . -w dist`)")
    cmd.add_argument("--out", type=Path, default=Path("dist"), help="default: dist")
    upstream_option(cmd, "wheel")
    version_option(cmd)

    cmd = add(
        "patch",
        _patch,
        f"patch an installed stock vLLM ({pins.supported_text()}) in place, offline",
    )
    cmd.add_argument(
        "--site-packages",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory that contains the vllm package (a site-packages directory)",
    )
    mode = cmd.add_mutually_exclusive_group()
    mode.add_argument("--revert", action="store_true", help="restore stock vLLM")
    mode.add_argument("--status", action="store_true", help="say what DIR holds")

    cmd = add("pr-patch", _pr_patch, "write the upstream PR patch (git format)")
    cmd.add_argument(
        "--out", type=Path, help="default: dist/vllm-<version>-tritonattn.patch"
    )
    upstream_option(cmd, "sdist")
    version_option(cmd, default=NEWEST)

    cmd = add("source-tree", _source_tree, "write the patched source tree (ROCm)")
    cmd.add_argument("--out", type=Path, default=Path("build"), help="default: build")
    upstream_option(cmd, "sdist")
    version_option(cmd)

    cmd = add("fetch", _fetch, "download and verify the upstream files into the cache")
    upstream_option(cmd, "wheel")
    upstream_option(cmd, "sdist")
    version_option(cmd)

    cmd = add("show", _show, "list the overlay files and the edited upstream files")
    version_option(cmd)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(args.func(args), flush=True)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`setup.py show | head`): not an error. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
