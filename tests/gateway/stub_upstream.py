"""An OpenAI-compatible upstream for the gateway tests, behaving as a real provider does,
failures included. It serves chat completions, the Responses API (plain and streamed with
its typed events, `response.completed` carrying the usage; stored responses read and
deleted by id) and embeddings (floats, or base64 as the SDK asks by default). What it does
is chosen by the last message's content (a Responses call's last input text):

  anything else            a plain answer, or a stream when `stream` is true
  "rate-limit-once <id>"   429 with retry-after the first time for <id>, then answers
  "unavailable"            503, always
  "stall..."               waits 3 s before answering
  "drop"                   a stream (or a plain body) cut off midway: the connection closes
  "slow-stream"            a stream whose events come 150 ms apart

Every request is recorded; GET /_calls lists them (method, path, authorization, body). Like a real
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
# Of those, read from the prompt cache and spent reasoning (as OpenAI's details report them).
CACHED_TOKENS = 3
REASONING_TOKENS = 1
# The usage tollgate books for a chat or Responses answer of the stub, every class included.
BOOKED = {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS,
          "cached_input_tokens": CACHED_TOKENS, "reasoning_tokens": REASONING_TOKENS}
CHAT_USAGE = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
              "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
              "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS, "audio_tokens": 0},
              "completion_tokens_details": {"reasoning_tokens": REASONING_TOKENS,
                                            "audio_tokens": 0}}
# Embeddings: the vector's size. The usage reported counts a string's words (what
# o200k_base gives for plain lowercase words) and a token array's length.
EMBEDDING_SIZE = 4


def content_of(body):
    """The text a call's behaviour is chosen by: the last chat message's, a Responses call's
    input (its last item's content), or an embeddings call's first input."""
    if "messages" in body:
        content = body["messages"][-1].get("content", "")
    else:
        content = body.get("input", "")
        if isinstance(content, list):
            last = content[-1] if content else ""
            content = last.get("content", "") if isinstance(last, dict) else \
                (content[0] if isinstance(content[0], str) else "")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content)
    return content


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = []
    lock = threading.Lock()
    seen = {}

    def log_message(self, *args):
        pass

    stored = {}

    def record(self, body):
        """Keeps a call for GET /_calls (the lock held by the caller)."""
        self.calls.append({"method": self.command, "path": self.path,
                           "authorization": self.headers.get("authorization"),
                           "traceparent": self.headers.get("traceparent"),
                           "body": body})

    def do_DELETE(self):
        rid = self.path.rsplit("/", 1)[-1]
        with self.lock:
            self.record({})
            found = self.stored.pop(rid, None)
        if found is None:
            return self.error(404, "not_found", {})
        self.json(200, {"id": rid, "object": "response", "deleted": True})

    def do_GET(self):
        if self.path.startswith("/v1/responses/"):
            with self.lock:
                self.record({})
                found = self.stored.get(self.path.split("?")[0].rsplit("/", 1)[-1])
            if found is None:
                return self.error(404, "not_found", {})
            return self.json(200, found)
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
            self.record(body)
            self.answer_id = f"chatcmpl-{len(self.calls)}"
            self.number = len(self.calls)
        if self.path.endswith("/embeddings"):
            return self.embeddings(body)
        content = content_of(body)
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
        if self.path.endswith("/responses"):
            return self.responses_api(body, content)
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
            "usage": CHAT_USAGE,
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def embeddings(self, body):
        import base64
        import struct
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        data = []
        for i, _ in enumerate(inputs):
            vector = [0.25 * (i + 1)] * EMBEDDING_SIZE
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{EMBEDDING_SIZE}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(len(x) if isinstance(x, list) else len(x.split()) for x in inputs)
        self.json(200, {"object": "list", "data": data, "model": body["model"],
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def response_object(self, body, status, usage):
        rid = f"resp_{self.number}"
        message = {"type": "message", "id": f"msg_{self.number}", "status": "completed",
                   "role": "assistant",
                   "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}
        return {"id": rid, "object": "response", "created_at": int(time.time()),
                "status": status, "model": body["model"], "output": [message] if usage else [],
                "max_output_tokens": body.get("max_output_tokens"), "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "instructions": body.get("instructions"),
                "previous_response_id": body.get("previous_response_id"),
                "usage": usage, "error": None, "incomplete_details": None, "metadata": {}}

    def responses_api(self, body, content):
        usage = {"input_tokens": PROMPT_TOKENS,
                 "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
                 "output_tokens": COMPLETION_TOKENS,
                 "output_tokens_details": {"reasoning_tokens": REASONING_TOKENS},
                 "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}
        done = self.response_object(body, "completed", usage)
        if body.get("store", True):
            with self.lock:
                self.stored[done["id"]] = done
        if not body.get("stream"):
            return self.json(200, done)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        seq = [0]

        def event(kind, **fields):
            obj = {"type": kind, "sequence_number": seq[0], **fields}
            seq[0] += 1
            self.chunk(f"event: {kind}\ndata: {json.dumps(obj)}\n\n".encode())

        started = self.response_object(body, "in_progress", None)
        event("response.created", response=started)
        event("response.in_progress", response=started)
        item = {"type": "message", "id": f"msg_{self.number}", "status": "in_progress",
                "role": "assistant", "content": []}
        event("response.output_item.added", output_index=0, item=item)
        event("response.content_part.added", item_id=item["id"], output_index=0,
              content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        for i, piece in enumerate(["Hel", "lo", " world"]):
            if content.startswith("drop") and i == 2:
                return self.cut()
            event("response.output_text.delta", item_id=item["id"], output_index=0,
                  content_index=0, delta=piece, logprobs=[])
        event("response.output_text.done", item_id=item["id"], output_index=0,
              content_index=0, text=ANSWER, logprobs=[])
        event("response.content_part.done", item_id=item["id"], output_index=0,
              content_index=0, part={"type": "output_text", "text": ANSWER, "annotations": []})
        event("response.output_item.done", output_index=0, item=done["output"][0])
        event("response.completed", response=done)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

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
            self.event({**base, "choices": [], "usage": CHAT_USAGE})
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
