"""An Anthropic Messages upstream for the gateway tests, behaving as Anthropic's API does:
`POST /v1/messages` plain and streamed (`message_start` with the input usage, cache
counts included; `content_block_*` events; `message_delta` with the cumulative output;
`message_stop`; a `ping` between), `POST /v1/messages/count_tokens`, errors as
`{"type":"error","error":{"type":...}}` and `anthropic-ratelimit-*` headers on every answer.
What it does is chosen by the last message's text:

  anything else            a plain answer, or a stream when `stream` is true
  "rate-limit-once <id>"   429 rate_limit_error with retry-after the first time, then answers
  "drop"                   a stream cut off midway: the connection closes

Every request is recorded; GET /_calls lists them (path, x-api-key, authorization,
anthropic-version, body).
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = "Hello from Claude"
# As Anthropic reports a prompt whose prefix was cached: `input_tokens` is the part after
# the last cache breakpoint, beside what the cache wrote and read (their sum is the prompt).
INPUT_TOKENS = 2
CACHE_WRITE_TOKENS = 2
CACHE_READ_TOKENS = 4
OUTPUT_TOKENS = 4
COUNTED_TOKENS = 42


def text_of(body):
    content = body.get("messages", [{}])[-1].get("content", "")
    if isinstance(content, list):
        content = " ".join(b.get("text", "") for b in content)
    return content


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = []
    seen = {}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path != "/_calls":
            return self.error(404, "not_found_error", {})
        with self.lock:
            self.json(200, self.calls)

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        with self.lock:
            self.calls.append({"path": self.path, "x-api-key": self.headers.get("x-api-key"),
                               "authorization": self.headers.get("authorization"),
                               "anthropic-version": self.headers.get("anthropic-version"),
                               "body": body})
            number = len(self.calls)
        if self.path == "/v1/messages/count_tokens":
            return self.json(200, {"input_tokens": COUNTED_TOKENS})
        if self.path != "/v1/messages":
            return self.error(404, "not_found_error", {})
        text = text_of(body)
        if text.startswith("rate-limit-once"):
            with self.lock:
                first = text not in self.seen
                self.seen[text] = True
            if first:
                return self.error(429, "rate_limit_error", {"retry-after": "1"})
        message = {"id": f"msg_{number}", "type": "message", "role": "assistant",
                   "model": body["model"], "content": [{"type": "text", "text": ANSWER}],
                   "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": INPUT_TOKENS,
                             "cache_creation_input_tokens": CACHE_WRITE_TOKENS,
                             "cache_read_input_tokens": CACHE_READ_TOKENS,
                             "output_tokens": OUTPUT_TOKENS}}
        if not body.get("stream"):
            return self.json(200, message)
        self.send_response(200)
        self.limits()
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        start = dict(message, content=[], stop_reason=None,
                     usage=dict(message["usage"], output_tokens=1))
        self.event("message_start", {"type": "message_start", "message": start})
        self.event("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
        self.event("ping", {"type": "ping"})
        for i, piece in enumerate(["Hello", " from", " Claude"]):
            if text == "drop" and i == 2:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})
        self.event("content_block_stop", {"type": "content_block_stop", "index": 0})
        self.event("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                     "usage": {"output_tokens": OUTPUT_TOKENS}})
        self.event("message_stop", {"type": "message_stop"})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def event(self, name, data):
        chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.flush()

    def limits(self):
        reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
        for unit, left in [("requests", "999"), ("tokens", "99000")]:
            self.send_header(f"anthropic-ratelimit-{unit}-limit", "1000" if unit == "requests" else "100000")
            self.send_header(f"anthropic-ratelimit-{unit}-remaining", left)
            self.send_header(f"anthropic-ratelimit-{unit}-reset", reset)
        self.send_header("request-id", "req_stub")

    def json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.limits()
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, kind, headers):
        data = json.dumps({"type": "error",
                           "error": {"type": kind, "message": "stub refusal"}}).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start(port=0):
    """Starts the stub on a loopback port; returns the server (its port in server_address)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
