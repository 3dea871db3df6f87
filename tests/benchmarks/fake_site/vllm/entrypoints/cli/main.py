"""Fake ``vllm serve`` and ``vllm bench sweep serve``.

The server answers /health, /metrics, /v1/completions (streamed or not; the text is
a function of the prompt) and /v1/chat/completions (not streamed).
``FAKE_VLLM_SOAK_ERROR_EVERY=n`` makes every n-th completion fail with HTTP 500;
``FAKE_VLLM_NO_CHAT=<backend>`` makes that server answer chat requests with 400;
``FAKE_VLLM_LATE_BUILDS=<backend>:<n>``: that server logs vLLM's JIT-monitor
warning n times when the first completion request comes."""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm import JIT_MONITOR_LINE


def _named(var):
    """The backend a FAKE_VLLM_* variable names; never equal to "no backend named"."""
    return os.environ.get(var) or object()


def _arg(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


_COUNT = [0]
_LOCK = threading.Lock()


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics":
            body = b'vllm:num_requests_running{model_name="m"} 1.0\n'
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with _LOCK:
            _COUNT[0] += 1
            n = _COUNT[0]
        backend, _, count = os.environ.get("FAKE_VLLM_LATE_BUILDS", "").partition(":")
        if backend == self.server.backend and not getattr(self.server, "built", 0):
            self.server.built = 1
            for _ in range(int(count)):
                print(JIT_MONITOR_LINE)
            sys.stdout.flush()
        every = int(os.environ.get("FAKE_VLLM_SOAK_ERROR_EVERY", "0"))
        if self.path == "/v1/embeddings":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(_embeddings(req["input"])).encode())
            return
        if self.path == "/v1/chat/completions":
            if _named("FAKE_VLLM_NO_CHAT") == self.server.backend:
                self.send_response(400)
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            reply = {"choices": [{"message": {"content": "hello"}}]}
            self.wfile.write(json.dumps(reply).encode())
            return
        if self.path != "/v1/completions" or (every and n % every == 0):
            self.send_response(500)
            self.end_headers()
            return
        prompt = req["prompt"]
        if isinstance(prompt, str):
            prompt = [ord(c) for c in prompt]
        text = " ".join(str(t % 97) for t in prompt[: req["max_tokens"]])
        self.send_response(200)
        self.end_headers()
        if not req.get("stream"):
            self.wfile.write(json.dumps({"choices": [{"text": text}]}).encode())
            return
        for i in range(min(req["max_tokens"], 10)):
            chunk = {"choices": [{"text": str(i)}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def _embeddings(texts):
    """A unit vector per text, a function of its words; ``FAKE_VLLM_WRONG=<backend>``
    turns that server's vectors (the check must notice)."""
    wrong = os.environ.get("FAKE_VLLM_WRONG")
    wrong = bool(wrong) and wrong == _SERVER_BACKEND[0]
    data = []
    for text in texts:
        n = len(text.split())
        vec = [1.0, n % 7 + 1.0, -1.0 if wrong else 1.0, 0.5]
        norm = sum(x * x for x in vec) ** 0.5
        data.append({"embedding": [x / norm for x in vec]})
    return {
        "data": data,
        "usage": {"prompt_tokens": sum(len(t.split()) for t in texts)},
    }


_SERVER_BACKEND = [None]


def serve(argv):
    failing = os.environ.get("FAKE_VLLM_SERVE_FAIL")
    if failing and failing == _arg(argv, "--attention-backend"):
        print("fake serve: simulated startup crash", flush=True)
        sys.exit(3)
    print(f"fake serve: {argv}", flush=True)
    time.sleep(0.3)
    server = ThreadingHTTPServer(("127.0.0.1", int(_arg(argv, "--port"))), _Health)
    server.backend = _arg(argv, "--attention-backend")
    _SERVER_BACKEND[0] = server.backend
    chosen = server.backend or "FLASH_ATTN"
    print(f"INFO [cuda.py:1] Using AttentionBackendEnum.{chosen} backend.", flush=True)
    server.serve_forever()


def _log(argv):
    """One JSON line per invocation in $FAKE_VLLM_LOG: the tests check the order."""
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a") as fh:
            entry = {"argv": argv, "pythonpath": os.environ.get("PYTHONPATH", "")}
            fh.write(json.dumps(entry) + "\n")


def _tok_per_s(attention_backend, seed):
    """Deterministic: FLASH_ATTN 1000, others 1100, times a per-seed factor."""
    base = 1000.0 if attention_backend == "FLASH_ATTN" else 1100.0
    noise = 1 + (int(seed) * 7 + len(attention_backend)) % 11 / 100
    return base * noise


def bench_sweep_serve(argv):
    """The layout of vLLM's sweep: OUT/EXP/BENCH--<name>/run=<i>.json, each with
    the bench params (``_benchmark_name`` included) merged in."""
    _log(["bench", "sweep", "serve", *argv])
    exp = os.path.join(_arg(argv, "--output-dir"), _arg(argv, "--experiment-name"))
    if ("--resume" in argv) != os.path.isdir(exp):
        sys.exit(f"fake sweep: --resume given: {'--resume' in argv}, {exp} exists")
    serve_cmd = _arg(argv, "--serve-cmd").split()
    backend = _arg(serve_cmd, "--attention-backend")
    with open(_arg(argv, "--bench-params")) as fh:
        params = json.load(fh)
    for name, p in params.items():
        run_dir = os.path.join(exp, f"BENCH--{name}")
        path = os.path.join(run_dir, "run=0.json")
        if os.path.exists(path):
            continue
        os.makedirs(run_dir, exist_ok=True)
        tps = _tok_per_s(backend, p["seed"])
        result = {
            "total_token_throughput": tps,
            "output_throughput": tps / 2,
            "median_ttft_ms": 10.0,
            "median_tpot_ms": 1.0,
            "p99_ttft_ms": 20.0,
            "_benchmark_name": name,
            "run_number": 0,
            **p,
        }
        with open(path, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2:])
    elif sys.argv[1:4] == ["bench", "sweep", "serve"]:
        bench_sweep_serve(sys.argv[4:])
    else:
        sys.exit(f"fake vllm: unsupported {sys.argv[1:]}")
