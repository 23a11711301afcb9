"""An OpenAI-compatible upstream that enforces its own limits the way OpenAI does, for the
deployment tests: a request budget (a bucket of `rpm` that refills continuously), a token
budget per window, and a concurrency cap. Every answer carries OpenAI's rate-limit headers
(`x-ratelimit-limit|remaining|reset-requests|tokens`); a call over a limit is refused with
429, OpenAI's error body and `retry-after` / `retry-after-ms`, and counted.

Control and observation (not part of OpenAI's API):
  POST /_control  {"mode": "ok" | "fail", "tokens_left": N, "window_s": S}
                  fail: every call answers 500 (server_error), as a provider's outage does
  GET  /_stats    {"served", "refused", "failed", "max_in_flight", "over_limit"}

A call's token need is its `max_completion_tokens` (or `max_tokens`): never more than what
tollgate reserves for it (prompt and output), so a gateway that respects what this stub
reports never sends it past its budget.
"""
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Limits:
    def __init__(self, rpm=None, tokens=None, window_s=60.0, concurrency=None, delay_s=0.0,
                 jitter=0.0):
        self.lock = threading.Lock()
        self.rpm = rpm
        self.requests = float(rpm) if rpm else None
        self.requests_at = time.monotonic()
        self.tokens_limit = tokens
        self.tokens_left = tokens
        self.window_s = window_s
        self.window_start = time.monotonic()
        self.concurrency = concurrency
        self.delay_s = delay_s
        # A call takes delay_s times a factor drawn from 1 ± jitter, as a provider's
        # generation times vary.
        self.jitter = jitter
        self.random = random.Random(7)
        self.in_flight = 0
        self.mode = "ok"
        self.stats = {"served": 0, "refused": 0, "failed": 0, "max_in_flight": 0,
                      "over_limit": 0}

    def refill(self, now):
        if self.rpm:
            self.requests = min(float(self.rpm),
                                self.requests + (now - self.requests_at) * self.rpm / 60.0)
            self.requests_at = now
        if self.tokens_limit is not None and now - self.window_start >= self.window_s:
            self.tokens_left = self.tokens_limit
            self.window_start = now

    def headers(self, now):
        h = {}
        if self.rpm:
            h["x-ratelimit-limit-requests"] = str(self.rpm)
            h["x-ratelimit-remaining-requests"] = str(int(self.requests))
            h["x-ratelimit-reset-requests"] = "%.3fs" % ((self.rpm - self.requests) * 60.0 / self.rpm)
        if self.tokens_limit is not None:
            h["x-ratelimit-limit-tokens"] = str(self.tokens_limit)
            h["x-ratelimit-remaining-tokens"] = str(max(0, self.tokens_left))
            h["x-ratelimit-reset-tokens"] = "%.3fs" % max(
                0.0, self.window_s - (now - self.window_start))
        return h

    def take(self, need):
        """None when the call may go on (its request, tokens and slot taken), else the 429's
        headers."""
        with self.lock:
            now = time.monotonic()
            self.refill(now)
            over = None
            if self.concurrency is not None and self.in_flight >= self.concurrency:
                over = {"retry-after-ms": "50", "retry-after": "1"}
            elif self.rpm and self.requests < 1.0:
                wait = (1.0 - self.requests) * 60.0 / self.rpm
                over = {"retry-after-ms": str(int(wait * 1000) + 1), "retry-after": str(int(wait) + 1)}
            elif self.tokens_left is not None and self.tokens_left < need:
                wait = max(0.0, self.window_s - (now - self.window_start))
                over = {"retry-after-ms": str(int(wait * 1000) + 1), "retry-after": str(int(wait) + 1)}
            if over is not None:
                self.stats["refused"] += 1
                self.stats["over_limit"] += 1
                return {**self.headers(now), **over}
            if self.rpm:
                self.requests -= 1.0
            if self.tokens_left is not None:
                self.tokens_left -= need
            self.in_flight += 1
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.in_flight)
            return None

    def done(self, served):
        with self.lock:
            self.in_flight -= 1
            self.stats["served" if served else "failed"] += 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer's head and body go in separate writes: without this, Nagle's algorithm holds
    # the body until the head is acknowledged, which a client may delay by 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send_json(self, status, obj, headers=None):
        data = json.dumps(obj).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        limits = self.server.limits
        if self.path == "/_stats":
            with limits.lock:
                self.send_json(200, dict(limits.stats))
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error",
                                           "code": None, "param": None}})

    def do_POST(self):
        limits = self.server.limits
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/_control":
            with limits.lock:
                if "mode" in body:
                    limits.mode = body["mode"]
                if "tokens_left" in body:
                    limits.tokens_left = body["tokens_left"]
                    limits.tokens_limit = limits.tokens_limit or body["tokens_left"]
                    limits.window_start = time.monotonic()
                if "window_s" in body:
                    limits.window_s = body["window_s"]
            return self.send_json(200, {"ok": True})
        need = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if limits.mode == "fail":
            with limits.lock:
                limits.stats["failed"] += 1
            return self.send_json(500, {"error": {"message": "The server had an error while processing your request.",
                                                  "type": "server_error", "code": None, "param": None}})
        over = limits.take(need)
        if over is not None:
            return self.send_json(429, {"error": {
                "message": "Rate limit reached for requests on this deployment.",
                "type": "requests", "code": "rate_limit_exceeded", "param": None}}, over)
        ended = False
        try:
            if limits.delay_s:
                with limits.lock:
                    factor = 1.0 + limits.random.uniform(-limits.jitter, limits.jitter)
                time.sleep(limits.delay_s * factor)
            with limits.lock:
                headers = limits.headers(time.monotonic())
            answer = {
                "id": "chatcmpl-limited", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
            }
            # The call's place is free once its answer is written: counted free first, as a
            # provider's is by the time its client has the whole answer.
            limits.done(True)
            ended = True
            self.send_json(200, answer, headers)
        finally:
            if not ended:
                limits.done(True)


def start(**limits):
    """Starts a limited stub on a loopback port; returns the server (port in server_address,
    its limits in `.limits`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.limits = Limits(**limits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    import sys
    # limited_upstream.py RPM: a stub of RPM requests a minute on a free port, printed.
    # limited_upstream.py --slots N --delay-s S --jitter J: N calls at once, each taking S
    # seconds times a factor drawn from 1 ± J.
    if sys.argv[1] == "--slots":
        s = start(concurrency=int(sys.argv[2]), delay_s=float(sys.argv[4]),
                  jitter=float(sys.argv[6]))
    else:
        s = start(rpm=int(sys.argv[1]))
    print(s.server_address[1], flush=True)
    threading.Event().wait()
