"""Fake ``vllm serve`` for the reliability suite: /health, /metrics and streamed
/v1/completions whose tokens are a function of the prompt, with vLLM's length rule
(400 when prompt + max_tokens > --max-model-len or prompt >= --max-model-len).

Faults, from the environment:
``FAKE_REL_SERVE_FAIL=1``: crash at startup (``=ARG``: only a server with ARG in
its arguments).
``FAKE_REL_5XX=n[,m...]``: the n-th (and m-th ...) completion request gets HTTP
500 (several, so that one reaches a client that did not cancel it first).
``FAKE_REL_ERROR_LINE=1``: log one vLLM-style ERROR line at the first completion.
``FAKE_REL_LATE_JIT=1``: log vLLM's JIT-monitor warning at the first completion.
``FAKE_REL_WRONG=ARG``: a server with ARG in its arguments (``!ARG``: without it)
changes one token of every output.
``FAKE_REL_NO_PREEMPT=1``: no preemptions even with --num-gpu-blocks-override.
``FAKE_REL_NO_EVICT=1``: the prefix cache never evicts (by default it holds
--num-gpu-blocks-override blocks and frees the least recently used first).
``FAKE_REL_NO_LENGTH_CHECK=1``: accept prompts of any length.
``FAKE_REL_TOKEN_S``: seconds per streamed token (default 0.001).
``FAKE_REL_SLOW_START=ARG``: a server with ARG in its arguments takes 2 s to start.
``FAKE_REL_PID_DIR``: write this server's pid to a file there at startup.
"""

import collections
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JIT_LINE = (
    "(EngineCore_DP0 pid=7) WARNING 11-30 12:00:00 [jit_monitor.py:136] Triton kernel "
    "JIT compilation during inference: kernel_unified_attention_2d. This causes a "
    "latency spike; consider extending warmup to cover this shape/config."
)
ERROR_LINE = "(APIServer pid=5) ERROR 11-30 12:00:00 [serving.py:1] fake engine error"


def _arg(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


class State:
    lock = threading.Lock()
    requests = 0
    preemptions = 0
    prefix_hits = 0
    drafts = 0
    blocks = collections.OrderedDict()  # cached block -> None, least recent first
    allocated = 0


def cache_request(argv, prompt, max_tokens) -> int:
    """Prefix-cache hits (tokens) of one request, then its blocks into the cache:
    the prompt's full blocks by content, the rest as blocks of their own; the least
    recently used leave once the cache holds more than --num-gpu-blocks-override."""
    size = int(_arg(argv, "--block-size", "16"))
    full = [tuple(prompt[: (k + 1) * size]) for k in range(len(prompt) // size)]
    hits = 0
    for block in full:
        if block not in State.blocks:
            break
        hits += size
    for block in full:
        State.blocks[block] = None
        State.blocks.move_to_end(block)
    for _ in range(-(-(len(prompt) + max_tokens) // size) - len(full)):
        State.allocated += 1
        State.blocks[("own", State.allocated)] = None
    capacity = _arg(argv, "--num-gpu-blocks-override")
    if capacity and not os.environ.get("FAKE_REL_NO_EVICT"):
        while len(State.blocks) > int(capacity):
            State.blocks.popitem(last=False)
    return hits


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # many requests arrive at once


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path == "/metrics":
            body = (
                "# TYPE vllm:num_preemptions_total counter\n"
                f'vllm:num_preemptions_total{{model_name="m",engine="0"}} '
                f"{float(State.preemptions)}\n"
                f'vllm:prefix_cache_hits_total{{model_name="m"}} {State.prefix_hits}\n'
                f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {State.drafts}\n'
            ).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def _reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def do_POST(self):
        argv = self.server.argv
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with State.lock:
            State.requests += 1
            n = State.requests
        if n == 1:
            if os.environ.get("FAKE_REL_ERROR_LINE"):
                print(ERROR_LINE, flush=True)
            if os.environ.get("FAKE_REL_LATE_JIT"):
                print(JIT_LINE, flush=True)
        fail_at = os.environ.get("FAKE_REL_5XX", "").split(",")
        if self.path != "/v1/completions" or str(n) in fail_at:
            return self._reply(500, {"error": "fake internal error"})
        prompt, max_tokens = req["prompt"], req.get("max_tokens") or 16
        limit = int(_arg(argv, "--max-model-len"))
        too_long = len(prompt) + max_tokens > limit or len(prompt) >= limit
        if too_long and not os.environ.get("FAKE_REL_NO_LENGTH_CHECK"):
            return self._reply(400, {"error": {"message": "maximum context length"}})
        with State.lock:
            if "--num-gpu-blocks-override" in argv and not os.environ.get(
                "FAKE_REL_NO_PREEMPT"
            ):
                State.preemptions += 1
            if "--no-enable-prefix-caching" not in argv:
                State.prefix_hits += cache_request(argv, prompt, max_tokens)
            if "--speculative-config" in argv:
                spec = json.loads(_arg(argv, "--speculative-config"))
                assert spec["method"] == "ngram" and spec["prompt_lookup_max"] >= 1
                State.drafts += 1
        toks = [(sum(prompt) + 31 * k) % 1000 for k in range(max_tokens)]
        wrong = os.environ.get("FAKE_REL_WRONG", "")
        if wrong and (wrong.lstrip("!") in argv) != wrong.startswith("!"):
            toks[3] += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        step = float(os.environ.get("FAKE_REL_TOKEN_S", "0.001"))
        try:
            time.sleep(2 * step)
            for t in toks:
                chunk = {"choices": [{"index": 0, "text": f" t{t}", "token_ids": [t]}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(step)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client cancelled: as vLLM, abort the request

    def log_message(self, *args):
        pass


def serve(argv):
    fail = os.environ.get("FAKE_REL_SERVE_FAIL", "")
    if fail == "1" or (fail and fail in argv):
        print("fake serve: simulated startup crash", flush=True)
        sys.exit(3)
    print(f"fake serve: {argv}", flush=True)
    if os.environ.get("FAKE_REL_SLOW_START", "\0") in argv:
        time.sleep(2.0)
    if os.environ.get("FAKE_REL_PID_DIR"):
        pid_dir = os.environ["FAKE_REL_PID_DIR"]
        with open(os.path.join(pid_dir, f"{os.getpid()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    server = Server(("127.0.0.1", int(_arg(argv, "--port"))), Handler)
    server.argv = argv
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] != "serve":
        sys.exit(f"fake vllm: unsupported {sys.argv[1:]}")
    serve(sys.argv[2:])
