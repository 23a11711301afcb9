"""An OpenAI-compatible upstream for the gateway tests, behaving as a real provider does,
failures included. What it does is chosen by the last message's content:

  anything else            a plain answer, or a stream when `stream` is true
  "rate-limit-once <id>"   429 with retry-after the first time for <id>, then answers
  "unavailable"            503, always
  "stall..."               waits 3 s before answering
  "drop"                   a stream (or a plain body) cut off midway: the connection closes
  "slow-stream"            a stream whose events come 150 ms apart

Every request is recorded; GET /_calls lists them (path, authorization, body). Like a real
provider, every answer has an id of its own (`chatcmpl-<n>`, n counting the requests).
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = "Hello world"
PROMPT_TOKENS = 11
COMPLETION_TOKENS = 2


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = []
    lock = threading.Lock()
    seen = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/_calls":
            with self.lock:
                body = json.dumps(self.calls).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        with self.lock:
            self.calls.append({"path": self.path,
                               "authorization": self.headers.get("authorization"),
                               "body": body})
            self.answer_id = f"chatcmpl-{len(self.calls)}"
        content = body["messages"][-1].get("content", "")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content)
        if content.startswith("rate-limit-once"):
            with self.lock:
                first = content not in self.seen
                self.seen[content] = True
            if first:
                return self.error(429, "rate_limit_exceeded", {"retry-after-ms": "300", "retry-after": "1"})
        if content == "unavailable":
            return self.error(503, "server_error", {})
        if content.startswith("stall"):
            time.sleep(3)
        if body.get("stream"):
            return self.stream(body, content)
        if content == "drop":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "1000")
            self.end_headers()
            self.wfile.write(b'{"id": "chatcmpl-stub", "choices": [')
            self.wfile.flush()
            return self.cut()
        answer = {
            "id": self.answer_id, "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, code, headers):
        data = json.dumps({"error": {"message": "stub refusal", "type": code, "code": code,
                                     "param": None}}).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, obj):
        self.chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def cut(self):
        # Close without finishing the body: what a lost connection looks like.
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def stream(self, body, content):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        base = {"id": self.answer_id, "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body["model"]}
        pieces = ["Hel", "lo", " world"]
        self.event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
        for i, piece in enumerate(pieces):
            if content == "slow-stream":
                time.sleep(0.15)
            if content == "drop" and i == 2:
                return self.cut()
            self.event({**base, "choices": [{"index": 0, "delta": {"content": piece},
                                             "finish_reason": None}]})
        self.event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self.event({**base, "choices": [],
                        "usage": {"prompt_tokens": PROMPT_TOKENS,
                                  "completion_tokens": COMPLETION_TOKENS,
                                  "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}})
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def start(port=0):
    """Starts the stub on a loopback port; returns the server (its port in server_address)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    import sys
    s = start(int(sys.argv[1]) if len(sys.argv) > 1 else 9000)
    print(s.server_address[1], flush=True)
    threading.Event().wait()
