"""Checks of the fork's edits inside a patched vLLM site.

Run by test_build_vllm.py through tests/site_runner.py, in a subprocess whose
``PYTHONPATH`` is the ``patched_vllm_site`` fixture, so vLLM is imported only there.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = "VLLM_ATTENTION_BACKEND"


def set_env(value):
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value


def check_version():
    import importlib.metadata

    import vllm

    return {
        "module": vllm.__version__,
        "metadata": importlib.metadata.version("vllm"),
    }


def check_env_getter():
    import vllm.envs as envs

    assert ENV in envs.environment_variables
    assert f"    {ENV}: str | None = None\n" in Path(envs.__file__).read_text()
    seen = {}
    for value in (None, "", "  ", " triton_attn "):
        set_env(value)
        seen[repr(value)] = envs.VLLM_ATTENTION_BACKEND
    set_env(None)
    return seen


def check_attention_config():
    from vllm.config.attention import AttentionConfig

    def backend(env, **kwargs):
        set_env(env)
        try:
            value = AttentionConfig(**kwargs).backend
            return None if value is None else value.name
        finally:
            set_env(None)

    result = {
        "unset": backend(None),
        "env": backend("TRITON_ATTN"),
        "env_lower": backend("triton_attn"),
        "env_auto": backend("auto"),
        "explicit_wins": backend("TRITON_ATTN", backend="FLASH_ATTN"),
    }
    for name, env, kwargs in (
        ("bad_env", "NOPE_ATTN", {}),
        ("bad_explicit", None, {"backend": "NOPE_ATTN"}),
    ):
        try:
            backend(env, **kwargs)
            result[name] = "no error"
        except ValueError as e:
            result[name] = str(e)
    return result


def _stock_module(name: str, rel: str):
    """Upstream's unpatched `rel`, from the patcher's backup in this site, loaded
    as module `name` next to the patched one."""
    import importlib.util

    import vllm
    from fork_build.site import BACKUP_DIR

    site = Path(vllm.__file__).resolve().parent.parent
    path = site / BACKUP_DIR / "files" / rel
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_msa_alias():
    """CUTLASS_MSA / TRITON_MSA: upstream's __post_init__ (0.33.0) maps them to
    `minimax_m3_msa_decode_backend` and sets `backend` to None; through
    VLLM_ATTENTION_BACKEND as through an explicit backend. None where the
    release has no such alias."""
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if not hasattr(AttentionBackendEnum, "CUTLASS_MSA"):
        return None
    stock = _stock_module("stock_attention_config", "vllm/config/attention.py")
    assert stock.AttentionConfig is not AttentionConfig
    assert not hasattr(stock.AttentionConfig, "backend_from_env")

    def state(cls, env, **kwargs):
        set_env(env)
        try:
            config = cls(**kwargs)
        finally:
            set_env(None)
        backend = config.backend
        return {
            "backend": None if backend is None else backend.name,
            "msa_decode": config.minimax_m3_msa_decode_backend,
        }

    aliases = ("CUTLASS_MSA", "TRITON_MSA")
    return {
        "stock_default": state(stock.AttentionConfig, None),
        "fork_default": state(AttentionConfig, None),
        "stock": {a: state(stock.AttentionConfig, None, backend=a) for a in aliases},
        "explicit": {a: state(AttentionConfig, None, backend=a) for a in aliases},
        "env": {a: state(AttentionConfig, a) for a in aliases},
        "explicit_wins": state(AttentionConfig, "CUTLASS_MSA", backend="FLASH_ATTN"),
    }


def check_registry():
    import importlib.util

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    spec = importlib.util.find_spec("vllm.v1.attention.backends.triton_attn")
    ours = REPO / "vllm" / "v1" / "attention" / "backends" / "triton_attn.py"
    triton_cls = AttentionBackendEnum.TRITON_ATTN.get_class()
    rocm_cls = AttentionBackendEnum.ROCM_ATTN.get_class()
    return {
        "TRITON_ATTN": AttentionBackendEnum.TRITON_ATTN.get_path(),
        "ROCM_ATTN": AttentionBackendEnum.ROCM_ATTN.get_path(),
        "module_is_ours": Path(spec.origin).read_bytes() == ours.read_bytes(),
        "triton_class": f"{triton_cls.__module__}.{triton_cls.__qualname__}",
        "rocm_is_alias": issubclass(rocm_cls, triton_cls),
    }


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


def _force_cpu_platform():
    # No GPU here: vLLM cannot infer a device, so pin the CPU platform (the
    # attention backend is chosen later, on the GPU; only the config is checked).
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()


def check_engine_args_precedence():
    _force_cpu_platform()
    import vllm.engine.arg_utils as arg_utils
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model = Path(tempfile.mkdtemp()) / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    base = ["--model", str(model), "--skip-tokenizer-init", "--load-format", "dummy"]
    result = {}
    for name, env, argv in (
        ("neither", None, []),
        ("env_only", "TRITON_ATTN", []),
        ("cli_only", None, ["--attention-backend", "FLASH_ATTN"]),
        ("both", "TRITON_ATTN", ["--attention-backend", "FLASH_ATTN"]),
        ("both_cli_auto", "TRITON_ATTN", ["--attention-backend", "auto"]),
    ):
        set_env(env)
        arg_utils._compute_kwargs.cache_clear()  # the parser reads the env default
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        args = parser.parse_args(base + argv)
        config = EngineArgs.from_cli_args(args).create_engine_config()
        backend = config.attention_config.backend
        result[name] = None if backend is None else backend.name
        set_env(None)
    return result


def _run_cli(*argv: str) -> str:
    """Run vLLM's CLI entry point (`vllm ...`) in this process; return its stdout."""
    import contextlib
    import io

    _force_cpu_platform()
    from vllm.entrypoints.cli.main import main

    out = io.StringIO()
    sys.argv = ["vllm", *argv]
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main()
    return out.getvalue()


def check_cli_version():
    return _run_cli("--version").strip()


def check_serve_help():
    """`vllm serve --help=attention-backend`; run it alone in its process, since
    vLLM decides at import time (from sys.argv) whether to build help texts."""
    sys.argv = ["vllm", "serve", "--help=attention-backend"]  # before vLLM imports
    return _run_cli("serve", "--help=attention-backend")
