"""The anchored edits (envs_patch/) and the change plan, on small fake trees."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fork_build import BuildError, pins, plan

REPO = Path(__file__).resolve().parents[2]
# Release-independent unit tests of apply_edits name this release in their messages.
VERSION = pins.DEFAULT_VERSION


def _edit(anchor, mode="insert_after", text="NEW\n", file="vllm/x.py"):
    return plan.Edit(file, anchor, mode, text, "why", "x.toml")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("insert_after", "a\nANCHOR\nNEW\nb\n"),
        ("insert_before", "a\nNEW\nANCHOR\nb\n"),
        ("replace", "a\nNEW\nb\n"),
    ],
)
def test_edit_modes(mode, expected):
    text, errors = plan.apply_edits(
        "vllm/x.py", "a\nANCHOR\nb\n", [_edit("ANCHOR\n", mode)], VERSION
    )
    assert errors == []
    assert text == expected


def test_missing_and_repeated_anchor_name_file_and_anchor():
    _, errors = plan.apply_edits(
        "vllm/x.py", "a\nA\nA\n", [_edit("MISSING\n"), _edit("A\n")], VERSION
    )
    assert len(errors) == 2
    assert "vllm/x.py" in errors[0] and "'MISSING'" in errors[0]
    assert "not found" in errors[0]
    assert "'A'" in errors[1] and "found 2 times" in errors[1]


@pytest.mark.parametrize("version", list(pins.SUPPORTED))
def test_anchor_failure_names_release_file_and_anchor(version):
    _, errors = plan.apply_edits("vllm/x.py", "a\n", [_edit("MISSING\n")], version)
    assert len(errors) == 1
    assert errors[0].startswith(f"vLLM {version}, vllm/x.py: anchor 'MISSING' ")
    assert "(x.toml) not found" in errors[0]


def test_anchors_match_upstream_text_only():
    # The second anchor exists only in text inserted by the first edit: not found.
    edits = [_edit("a\n", text="b\n"), _edit("b\n")]
    _, errors = plan.apply_edits("vllm/x.py", "a\nc\n", edits, VERSION)
    assert len(errors) == 1 and "'b'" in errors[0]


def test_overlapping_anchors_fail():
    _, errors = plan.apply_edits(
        "vllm/x.py", "abcdef\n", [_edit("abcd"), _edit("cdef")], VERSION
    )
    assert errors and "overlap" in errors[0]


def _fake_repo(tmp_path: Path, toml: str, overlay: dict[str, str]) -> Path:
    root = tmp_path / "repo"
    (root / "envs_patch").mkdir(parents=True)
    (root / "envs_patch" / "x.toml").write_text(toml)
    for rel, text in overlay.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


GOOD_TOML = """
[[edit]]
file = "vllm/envs.py"
why = "test"
anchor = "X = 1\\n"
insert_after = "Y = 2\\n"
"""


def _reader(files: dict[str, str]):
    return lambda path: files[path].encode() if path in files else None


def test_compute_changes_kinds(tmp_path, target):
    root = _fake_repo(
        tmp_path,
        GOOD_TOML,
        {
            "vllm/attention/ops/k.py": "k = 1\n",
            "vllm/v1/attention/backends/triton_attn.py": "ours = 1\n",
            "vllm/attention/ops/__pycache__/k.cpython-311.pyc": "junk",
        },
    )
    upstream = {
        "vllm/envs.py": "X = 1\n",
        "vllm/v1/attention/backends/triton_attn.py": "stock = 1\n",
        "vllm/_version.py": f"__version__ = version = '{target.version}'\n",
    }
    changes = plan.compute_changes(
        _reader(upstream), target, with_version=True, root=root
    )
    by_path = {c.path: c for c in changes}
    assert set(by_path) == {
        "vllm/attention/ops/k.py",
        "vllm/v1/attention/backends/triton_attn.py",
        "vllm/envs.py",
        "vllm/_version.py",
    }
    assert by_path["vllm/attention/ops/k.py"].kind == "added"
    assert by_path["vllm/v1/attention/backends/triton_attn.py"].kind == "replaced"
    assert by_path["vllm/envs.py"].new == b"X = 1\nY = 2\n"
    version_py = by_path["vllm/_version.py"].new.decode()
    assert f"__version__ = version = '{target.version}+tritonattn.1'\n" in version_py


def test_compute_changes_refuses_another_release_tree(tmp_path, target):
    root = _fake_repo(tmp_path, GOOD_TOML, {"vllm/attention/ops/k.py": "k = 1\n"})
    upstream = {
        "vllm/envs.py": "X = 1\n",
        "vllm/_version.py": "__version__ = version = '0.30.0'\n",
    }
    with pytest.raises(BuildError) as info:
        plan.compute_changes(_reader(upstream), target, with_version=True, root=root)
    assert f"upstream tree is vLLM 0.30.0, not the {target.version}" in str(info.value)


def test_overlay_may_not_shadow_other_upstream_files(tmp_path, target):
    root = _fake_repo(tmp_path, GOOD_TOML, {"vllm/sampling_params.py": "x\n"})
    upstream = {"vllm/envs.py": "X = 1\n", "vllm/sampling_params.py": "stock\n"}
    with pytest.raises(BuildError, match="REPLACED_UPSTREAM_FILES"):
        plan.compute_changes(_reader(upstream), target, with_version=False, root=root)


def test_all_errors_reported_together(tmp_path, target):
    toml = GOOD_TOML + GOOD_TOML.replace("vllm/envs.py", "vllm/other.py")
    root = _fake_repo(tmp_path, toml, {"vllm/attention/ops/k.py": "k\n"})
    upstream = {"vllm/envs.py": "no anchor here\n"}
    with pytest.raises(BuildError) as info:
        plan.compute_changes(_reader(upstream), target, with_version=False, root=root)
    message = str(info.value)
    assert "nothing was written" in message
    assert f"vLLM {target.version}, vllm/envs.py: anchor 'X = 1'" in message
    assert f"vLLM {target.version}, vllm/other.py: upstream file not found" in message


def _versions_toml(versions: list[str]) -> str:
    listed = ", ".join(f'"{v}"' for v in versions)
    return GOOD_TOML + f"versions = [{listed}]\n"


@pytest.mark.parametrize("only", list(pins.SUPPORTED))
def test_edit_with_versions_applies_to_those_releases_only(tmp_path, only):
    root = _fake_repo(tmp_path, _versions_toml([only]), {"vllm/a.py": "a\n"})
    (edit,) = plan.load_edits(root)
    assert edit.versions == (only,)
    upstream = {"vllm/envs.py": "X = 1\n"}
    for version, release in pins.SUPPORTED.items():
        applies = version == only
        assert edit.applies_to(version) is applies
        assert plan.edits_for(release, root) == ([edit] if applies else [])
        assert plan.edited_files(release, root) == (["vllm/envs.py"] if applies else [])
        changes = plan.compute_changes(
            _reader(upstream), release, with_version=False, root=root
        )
        edited = {c.path: c.new for c in changes if c.kind == "edited"}
        assert edited == ({"vllm/envs.py": b"X = 1\nY = 2\n"} if applies else {})


def test_edit_without_versions_applies_to_every_release(tmp_path):
    root = _fake_repo(tmp_path, GOOD_TOML, {"vllm/a.py": "a\n"})
    (edit,) = plan.load_edits(root)
    assert edit.versions is None
    assert all(edit.applies_to(v) for v in pins.SUPPORTED)
    assert all(plan.edits_for(r, root) == [edit] for r in pins.SUPPORTED.values())


def test_edit_for_an_unknown_release_is_refused(tmp_path):
    known = next(iter(pins.SUPPORTED))
    root = _fake_repo(tmp_path, _versions_toml([known, "0.30.0"]), {"vllm/a.py": "a"})
    with pytest.raises(BuildError) as info:
        plan.load_edits(root)
    message = str(info.value)
    assert "x.toml edit #1" in message and "0.30.0" in message
    assert f"(supported: {', '.join(pins.SUPPORTED)})" in message


@pytest.mark.parametrize(
    "toml",
    [
        '[[edit]]\nfile = "vllm/envs.py"\nanchor = "X"\n',  # no mode
        '[[edit]]\nfile = "vllm/envs.py"\nanchor = "X"\nreplace = "Y"\nprepend = "Z"\n',
        '[[edit]]\nfile = "vllm/envs.py"\nanchor = ""\nreplace = "Y"\n',
    ],
)
def test_malformed_edit_files_fail(tmp_path, toml):
    root = _fake_repo(tmp_path, toml, {"vllm/a.py": "a\n"})
    with pytest.raises(BuildError, match="x.toml"):
        plan.load_edits(root)


def test_repo_edits_are_well_formed(target):
    edits = plan.edits_for(target, REPO, source=True)
    installed = {
        "vllm/envs.py",
        "vllm/config/attention.py",
        "vllm/engine/arg_utils.py",
        "vllm/v1/attention/backends/registry.py",
    }
    assert {e.file for e in edits} == installed | {"setup.py"}
    assert set(plan.edited_files(target)) == installed
    assert set(plan.edited_files(target, source=True)) == installed | {"setup.py"}
    assert all(e.why for e in edits)
    assert all(e.applies_to(target.version) for e in edits)


def test_overlay_is_the_vllm_directory(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "vllm", root / "vllm")
    (root / "vllm" / "__pycache__").mkdir(exist_ok=True)
    (root / "vllm" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    expected = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "vllm").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert set(plan.overlay_files(root)) == expected
    assert "vllm/v1/attention/backends/triton_attn.py" in expected


def test_show_into_a_closed_pipe_is_quiet():
    """`python setup.py show | head -1`: the reader leaves early, no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write of the command meets a closed pipe
    try:
        proc = subprocess.run(
            [sys.executable, "setup.py", "show"],
            cwd=plan.REPO_ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    assert proc.stderr == ""


def run_setup_py(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != pins.VERSION_ENV}
    return subprocess.run(
        [sys.executable, "setup.py", *args],
        cwd=plan.REPO_ROOT,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_refuses_an_unsupported_vllm_version(tmp_path):
    out = tmp_path / "dist"
    proc = run_setup_py("wheel", "--vllm-version", "0.30.0", "--out", str(out))
    assert proc.returncode != 0
    assert "invalid choice: '0.30.0'" in proc.stderr
    assert ", ".join(repr(v) for v in pins.SUPPORTED) in proc.stderr
    assert not out.exists()


def test_environment_with_an_unsupported_vllm_version_is_refused():
    proc = run_setup_py("show", **{pins.VERSION_ENV: "0.30.0"})
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: vLLM 0.30.0 is not supported")
    assert f"supported versions: {', '.join(pins.SUPPORTED)} " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("via", ["option", "environment"])
def test_show_names_the_chosen_release(target, via):
    if via == "option":
        proc = run_setup_py("show", "--vllm-version", target.version)
    else:
        proc = run_setup_py("show", **{pins.VERSION_ENV: target.version})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"fork version: {target.fork_version} ")
    assert "edited:  setup.py (source trees only)" in proc.stdout


def test_show_defaults_to_the_default_release():
    proc = run_setup_py("show")
    assert proc.returncode == 0, proc.stderr
    default = pins.SUPPORTED[pins.DEFAULT_VERSION]
    assert proc.stdout.startswith(f"fork version: {default.fork_version} ")
