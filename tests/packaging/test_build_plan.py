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
        plan.KEPT_UPSTREAM_FILES["vllm/v1/attention/backends/triton_attn.py"],
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


def _skip_toml(skip: dict[str, str]) -> str:
    listed = ", ".join(f'"{v}" = "{why}"' for v, why in skip.items())
    return GOOD_TOML + f"skip = {{ {listed} }}\n"


@pytest.mark.parametrize("skipped", list(pins.SUPPORTED))
def test_edit_skips_the_releases_it_names(tmp_path, skipped):
    root = _fake_repo(tmp_path, _skip_toml({skipped: "no X there"}), {"vllm/a.py": ""})
    (edit,) = plan.load_edits(root)
    assert edit.skip == ((skipped, "no X there"),)
    for version, release in pins.SUPPORTED.items():
        applies = version != skipped
        upstream = {"vllm/envs.py": "X = 1\n" if applies else "no anchor\n"}
        assert edit.applies_to(version) is applies
        assert plan.edits_for(release, root) == ([edit] if applies else [])
        changes = plan.compute_changes(
            _reader(upstream), release, with_version=False, root=root
        )
        edited = {c.path: c.new for c in changes if c.kind == "edited"}
        assert edited == ({"vllm/envs.py": b"X = 1\nY = 2\n"} if applies else {})


def test_a_skipped_release_that_holds_the_anchor_fails(tmp_path):
    skipped, release = next(iter(pins.SUPPORTED.items()))
    root = _fake_repo(tmp_path, _skip_toml({skipped: "not there"}), {"vllm/a.py": ""})
    with pytest.raises(BuildError) as info:
        plan.compute_changes(
            _reader({"vllm/envs.py": "X = 1\n"}), release, with_version=False, root=root
        )
    message = str(info.value)
    assert (
        f"vLLM {skipped}, vllm/envs.py: anchor 'X = 1' (x.toml) is present" in message
    )
    assert "'not there'" in message and "nothing was written" in message


def test_edit_without_skip_applies_to_every_release(tmp_path):
    root = _fake_repo(tmp_path, GOOD_TOML, {"vllm/a.py": "a\n"})
    (edit,) = plan.load_edits(root)
    assert edit.skip == ()
    assert all(edit.applies_to(v) for v in pins.SUPPORTED)
    assert all(plan.edits_for(r, root) == [edit] for r in pins.SUPPORTED.values())


@pytest.mark.parametrize(
    ("skip", "expected"),
    [
        ({"0.30.0": "old"}, "`skip` names ['0.30.0'], not a supported release"),
        ({next(iter(pins.SUPPORTED)): " "}, "must map each release it skips to"),
    ],
)
def test_skip_of_an_unknown_release_or_without_reason_is_refused(
    tmp_path, skip, expected
):
    root = _fake_repo(tmp_path, _skip_toml(skip), {"vllm/a.py": "a"})
    with pytest.raises(BuildError) as info:
        plan.load_edits(root)
    assert "x.toml edit #1" in str(info.value) and expected in str(info.value)


def test_the_old_versions_key_is_refused(tmp_path):
    toml = GOOD_TOML + f'versions = ["{next(iter(pins.SUPPORTED))}"]\n'
    root = _fake_repo(tmp_path, toml, {"vllm/a.py": "a"})
    with pytest.raises(BuildError, match=r"unknown keys: \['versions'\]"):
        plan.load_edits(root)


def test_a_new_release_builds_only_once_every_edit_is_checked(tmp_path, monkeypatch):
    """A pin added for a release nobody reviewed (here: a fake 9.9.9 whose tree is
    the newest release's with one anchor moved): every edit applies to it, so the
    build stops naming the release, file and anchor until that edit is updated or
    skips the release with a reason; a skip where the anchor is present stops it
    too. The real edits of envs_patch/ are used."""
    import zipfile

    from fork_build import upstream
    from fork_build.cli import NEWEST

    wheel = upstream.fetch("wheel", pins.SUPPORTED[NEWEST])
    fake = pins.Upstream("9.9.9", "w.whl", "0" * 64, "s.tar.gz", "0" * 64)
    monkeypatch.setitem(pins.SUPPORTED, fake.version, fake)
    with zipfile.ZipFile(wheel) as zf:
        tree = {name: zf.read(name) for name in zf.namelist() if name.endswith(".py")}
    edit = next(e for e in plan.load_edits() if e.file == "vllm/envs.py")
    moved = dict(tree)
    moved[edit.file] = tree[edit.file].replace(edit.anchor.encode(), b"# moved\n")
    read = lambda files: files.get  # noqa: E731
    changes = plan.compute_changes(read(tree), fake, with_version=False)
    assert {c.path for c in changes if c.kind == "edited"} == set(
        plan.edited_files(fake)
    )
    with pytest.raises(BuildError) as info:
        plan.compute_changes(read(moved), fake, with_version=False)
    first_line = edit.anchor.strip().splitlines()[0]
    expected = f"vLLM 9.9.9, vllm/envs.py: anchor {first_line!r} ({edit.source}) not"
    assert expected in str(info.value)
    # Skipping the release, with a reason, is the other way through; a skip is
    # checked against the tree like the edit itself.
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "envs_patch", repo / "envs_patch")
    shutil.copytree(REPO / "vllm", repo / "vllm")
    source = repo / "envs_patch" / edit.source
    text = source.read_text()
    at = text.index("anchor = '''\n" + edit.anchor + "'''")
    source.write_text(text[:at] + 'skip = { "9.9.9" = "moved" }\n' + text[at:])
    changes = plan.compute_changes(read(moved), fake, with_version=False, root=repo)
    assert edit.file in {c.path for c in changes if c.kind == "edited"}
    with pytest.raises(BuildError, match="is present, but the edit skips 9.9.9"):
        plan.compute_changes(read(tree), fake, with_version=False, root=repo)


def test_replaced_upstream_backend_is_kept_under_its_own_name(tmp_path, target):
    stock = "vllm/v1/attention/backends/triton_attn.py"
    kept = plan.KEPT_UPSTREAM_FILES[stock]
    root = _fake_repo(tmp_path, GOOD_TOML, {stock: "ours = 1\n"})
    upstream = {"vllm/envs.py": "X = 1\n", stock: "stock = 1\n"}
    by_path = {
        c.path: c
        for c in plan.compute_changes(
            _reader(upstream), target, with_version=False, root=root
        )
    }
    assert by_path[kept].kind == "kept" and by_path[kept].old is None
    assert by_path[kept].new == b"stock = 1\n"
    assert by_path[stock].new == b"ours = 1\n"
    upstream[kept] = "already there\n"
    with pytest.raises(BuildError, match="kept copy of .* already exists"):
        plan.compute_changes(_reader(upstream), target, with_version=False, root=root)


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
    every = plan.load_edits(REPO)
    edits = plan.edits_for(target, REPO, source=True)
    assert edits == [e for e in every if e.applies_to(target.version)]
    assert all(e.why for e in every)
    assert all(why for e in every for _, why in e.skip)
    installed = {e.file for e in edits if not e.source_only}
    assert set(plan.edited_files(target)) == installed
    assert set(plan.edited_files(target, source=True)) == {e.file for e in edits}
    # Build files (setup.py) are edited in source trees only.
    assert all(not e.file.startswith("vllm/") for e in edits if e.source_only)


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
    assert f"({pins.VERSION_ENV}=0.30.0)" in proc.stderr  # where it came from
    assert f"Set {pins.VERSION_ENV} to one of them" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_unsupported_release_is_refused_in_the_words_of_the_entry_point(
    monkeypatch,
):
    """setup.py's refusal names its option; pip's (the backend) names pip's
    config setting, never setup.py's option."""
    monkeypatch.delenv(pins.VERSION_ENV, raising=False)
    with pytest.raises(BuildError) as setup_py:
        pins.upstream("0.30.0")
    assert "Choose one with `--vllm-version VERSION`" in str(setup_py.value)
    assert "--config-settings" not in str(setup_py.value)
    with pytest.raises(BuildError) as pip:
        pins.upstream("0.30.0", option=pins.PIP_OPTION)
    assert "Choose one with `--config-settings vllm-version=VERSION`" in str(pip.value)
    assert "--vllm-version" not in str(pip.value)


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
