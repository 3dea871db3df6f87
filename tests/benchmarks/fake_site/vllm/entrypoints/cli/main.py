"""Fake ``vllm serve`` and ``vllm bench serve`` (writes a result).

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
        if self.path == "/v1/chat/completions":
            if os.environ.get("FAKE_VLLM_NO_CHAT") == self.server.backend:
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


def serve(argv):
    if os.environ.get("FAKE_VLLM_SERVE_FAIL") == _arg(argv, "--attention-backend"):
        print("fake serve: simulated startup crash", flush=True)
        sys.exit(3)
    print(f"fake serve: {argv}", flush=True)
    time.sleep(0.3)
    server = ThreadingHTTPServer(("127.0.0.1", int(_arg(argv, "--port"))), _Health)
    server.backend = _arg(argv, "--attention-backend")
    server.serve_forever()


def bench(argv):
    n = int(_arg(argv, "--num-prompts"))
    n_in = int(_arg(argv, "--random-input-len"))
    n_out = int(_arg(argv, "--random-output-len"))
    dur = 1.0 + n / 1000
    result = {
        "duration": dur,
        "completed": n,
        "failed": 0,
        "total_input_tokens": n * n_in,
        "total_output_tokens": n * n_out,
        "request_throughput": n / dur,
        "output_throughput": n * n_out / dur,
        "total_token_throughput": n * (n_in + n_out) / dur,
        "request_rate": _arg(argv, "--request-rate", "inf"),
        "num_prompts": n,
    }
    for m in ("ttft", "tpot", "itl", "e2el"):
        for s in ("mean", "median", "std", "p50", "p99"):
            result[f"{s}_{m}_ms"] = 10.0
    path = os.path.join(_arg(argv, "--result-dir"), _arg(argv, "--result-filename"))
    with open(path, "w") as fh:
        json.dump(result, fh)
    print("fake bench: wrote", path, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2:])
    elif sys.argv[1:3] == ["bench", "serve"]:
        bench(sys.argv[3:])
    else:
        sys.exit(f"fake vllm: unsupported {sys.argv[1:]}")
