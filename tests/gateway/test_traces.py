"""Traces as an operator's collector receives them: a receiver built on OpenTelemetry's own
protocol package (`opentelemetry-proto`) takes OTLP/HTTP from a running server, and the
checks follow an admitted gateway call, a refused one and a durable job claimed by a worker
through their span trees, parent links to the caller's `traceparent`, attributes, and the
`traceparent` the upstream received; log lines carry the same trace. A receiver that is
down costs the callers nothing and its spans are counted as dropped. Run by
tests/gateway.rs, which gives the `tollgate` executable in TOLLGATE_BIN."""
import json
import os
import sys
import threading
import time
import unittest
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

sys.path.insert(0, os.path.dirname(__file__))
import serving  # noqa: E402
import stub_upstream  # noqa: E402

KEYS = {"a": "a-key", "poor": "poor-key"}
WORKER = "worker-key"
MODEL = "gpt-4o-mini"


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: each request body an ExportTraceServiceRequest."""
    spans = []
    posts = []
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.posts.append((self.path, self.headers.get("content-type")))
            for rs in request.resource_spans:
                service = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.spans.append((service, span))
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def attrs(span):
    out = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = getattr(v, kind) if kind else None
    return out


TRACE = "4bf92f3577b34da6a3ce929d0e0e47"
PARENT = "00f067aa0ba902b7"


def traceparent(n):
    return f"00-{TRACE}{n:02x}-{PARENT}-01"


class Traces(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=cls.receiver.serve_forever, daemon=True).start()
        cls.stub = stub_upstream.start()
        config = {
            "auth": {"callers": {v: k for k, v in KEYS.items()}, "workers": {WORKER: "w1"}},
            "telemetry": {"otlp_endpoint": f"http://127.0.0.1:{cls.receiver.server_address[1]}",
                          "service_name": "tollgate-under-test"},
            "tenants": {"a": {}, "poor": {"requests": {"capacity": 1, "refill_per_s": 0.001}}},
            "gateway": {
                "upstreams": {"local": {"base_url": f"http://127.0.0.1:{cls.stub.server_address[1]}/v1"}},
                "models": {MODEL: {"upstream": "local", "tokenizer": "o200k_base",
                                   "default_max_output_tokens": 64}},
            },
        }
        cls.serving = serving.Serving(config, args=["--log-format", "json"])
        cls.base = cls.serving.base

    @classmethod
    def tearDownClass(cls):
        cls.serving.stop()
        cls.stub.shutdown()
        cls.receiver.shutdown()

    def children(self, trace_id, parent):
        """The spans of `trace_id` whose parent is `parent`, by name."""
        with Receiver.lock:
            return {s.name: s for _, s in Receiver.spans
                    if s.trace_id.hex() == trace_id and s.parent_span_id == parent.span_id}

    def trace(self, trace_id, names, timeout=15):
        """The spans of `trace_id` once every name in `names` has arrived."""
        until = time.time() + timeout
        while True:
            with Receiver.lock:
                found = [(svc, s) for svc, s in Receiver.spans if s.trace_id.hex() == trace_id]
            have = {s.name for _, s in found}
            if set(names) <= have:
                return {s.name: (svc, s) for svc, s in found}
            if time.time() > until:
                self.fail(f"spans of {trace_id}: {sorted(have)}, wanted {sorted(names)}")
            time.sleep(0.1)

    def chat(self, tenant, n, content="hello"):
        client = openai.OpenAI(api_key=KEYS[tenant], base_url=self.base + "/v1", max_retries=0)
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=20,
            extra_headers={"traceparent": traceparent(n)})

    def post(self, path, body, key, headers=None):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     method="POST",
                                     headers={"Authorization": f"Bearer {key}",
                                              "Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def test_an_admitted_call_from_the_caller_through_the_upstream(self):
        self.chat("a", 1, "traced call")
        spans = self.trace(TRACE + "01", ["POST /v1/chat/completions", "tollgate.admission",
                                          "tollgate.writer.queue", "tollgate.policy",
                                          "tollgate.store.commit", f"chat {MODEL}",
                                          "tollgate.completion"])
        service, server = spans["POST /v1/chat/completions"]
        self.assertEqual(service["service.name"], "tollgate-under-test")
        # The caller's span is the parent; the server span is the server kind.
        self.assertEqual(server.parent_span_id.hex(), PARENT)
        self.assertEqual(server.kind, server.SPAN_KIND_SERVER)
        a = attrs(server)
        self.assertEqual(a["http.request.method"], "POST")
        self.assertEqual(a["http.route"], "/v1/chat/completions")
        self.assertEqual(a["http.response.status_code"], 200)
        _, admission = spans["tollgate.admission"]
        self.assertEqual(admission.parent_span_id, server.span_id)
        a = attrs(admission)
        self.assertEqual(a["tollgate.tenant"], "a")
        self.assertEqual(a["tollgate.outcome"], "accepted")
        self.assertEqual(a["gen_ai.request.model"], MODEL)
        self.assertEqual(len(a["tollgate.operation_key_hash"]), 16)
        self.assertIn("tollgate.policy", a)
        # The writer's steps are the admission's children, in order.
        steps = self.children(TRACE + "01", admission)
        self.assertEqual(sorted(steps), ["tollgate.policy", "tollgate.store.commit",
                                         "tollgate.writer.queue"])
        queue, policy, commit = (steps[n] for n in
                                 ["tollgate.writer.queue", "tollgate.policy", "tollgate.store.commit"])
        self.assertLessEqual(queue.end_time_unix_nano, policy.start_time_unix_nano + 1000)
        self.assertLessEqual(policy.end_time_unix_nano, commit.end_time_unix_nano)
        _, up = spans[f"chat {MODEL}"]
        self.assertEqual(up.kind, up.SPAN_KIND_CLIENT)
        self.assertEqual(up.parent_span_id, server.span_id)
        a = attrs(up)
        self.assertEqual(a["gen_ai.request.model"], MODEL)
        self.assertEqual(a["gen_ai.operation.name"], "chat")
        self.assertEqual(a["gen_ai.provider.name"], "openai")
        self.assertGreater(a["gen_ai.usage.input_tokens"], 0)
        self.assertGreater(a["gen_ai.usage.output_tokens"], 0)
        self.assertEqual(a["http.response.status_code"], 200)
        _, completion = spans["tollgate.completion"]
        self.assertEqual(completion.parent_span_id, server.span_id)
        self.assertEqual(attrs(completion)["tollgate.result"], "succeeded")
        # The completion's own trip through the writer, as its children.
        self.assertEqual(sorted(self.children(TRACE + "01", completion)),
                         ["tollgate.store.commit", "tollgate.writer.queue"])
        # The upstream got the upstream span's own context, in the same trace.
        with stub_upstream.Handler.lock:
            sent = [c["traceparent"] for c in stub_upstream.Handler.calls
                    if (c["traceparent"] or "").split("-")[1:2] == [TRACE + "01"]]
        self.assertEqual(sent, [f"00-{TRACE}01-{up.span_id.hex()}-01"])
        # Log lines of the call name the same trace.
        with open(self.serving.log_path) as f:
            lines = [json.loads(line) for line in f if line.startswith("{")]
        mine = [line for line in lines if line.get("trace_id") == TRACE + "01"]
        self.assertTrue(any(line.get("message") == "gateway call" for line in mine), lines[-5:])
        self.assertTrue(all(len(line["span_id"]) == 16 for line in mine))

    def test_a_refused_call_says_what_refused_it(self):
        self.chat("poor", 2, "first")
        with self.assertRaises(openai.RateLimitError):
            self.chat("poor", 3, "second")
        spans = self.trace(TRACE + "03", ["POST /v1/chat/completions", "tollgate.admission",
                                          "tollgate.writer.queue", "tollgate.store.commit"])
        _, admission = spans["tollgate.admission"]
        a = attrs(admission)
        self.assertEqual(a["tollgate.outcome"], "rejected")
        self.assertEqual(a["tollgate.reason"], "tenant_rate")
        self.assertEqual(a["tollgate.refused_by"], "tenant.poor.requests")
        self.assertEqual(admission.status.code, admission.status.STATUS_CODE_ERROR)
        self.assertEqual(attrs(spans["POST /v1/chat/completions"][1])["http.response.status_code"], 429)
        self.assertNotIn(f"chat {MODEL}", spans)

    def test_a_durable_job_continues_its_trace_when_claimed(self):
        job = {"key": "job-1", "route": "durable", "input_tokens": 10, "max_output_tokens": 10,
               "deadline_ms": int(time.time() * 1000) + 600_000}
        status, _ = self.post("/v1/admit", job, KEYS["a"], {"traceparent": traceparent(4)})
        self.assertEqual(status, 202)
        status, claimed = self.post("/v1/dispatch", {"count": 1}, WORKER,
                                    {"traceparent": traceparent(5)})
        self.assertEqual(status, 200)
        [claim] = claimed["claimed"]
        # The claim hands the job's trace to the worker.
        self.assertEqual(claim["traceparent"].split("-")[1], TRACE + "04")
        spans = self.trace(TRACE + "04", ["POST /v1/admit", "tollgate.admission", "tollgate.dispatch"])
        _, admit = spans["POST /v1/admit"]
        _, dispatch = spans["tollgate.dispatch"]
        self.assertEqual(claim["traceparent"].split("-")[2], spans["tollgate.admission"][1].span_id.hex())
        self.assertEqual(dispatch.parent_span_id, spans["tollgate.admission"][1].span_id)
        a = attrs(dispatch)
        self.assertEqual(a["tollgate.worker"], "w1")
        self.assertEqual(a["tollgate.attempt"], 1)
        # Linked to the worker's own request, in the worker's trace.
        worker = self.trace(TRACE + "05", ["POST /v1/dispatch"])["POST /v1/dispatch"][1]
        self.assertEqual([(l.trace_id.hex(), l.span_id) for l in dispatch.links],
                         [(TRACE + "05", worker.span_id)])
        self.assertTrue(all(path == "/v1/traces" for path, _ in Receiver.posts))
        self.assertTrue(all(ct == "application/x-protobuf" for _, ct in Receiver.posts))

    def test_a_receiver_that_is_down_costs_callers_nothing(self):
        down = serving.free_port()
        config = {
            "auth": {"callers": {"down-key": "a"}},
            "telemetry": {"otlp_endpoint": f"http://127.0.0.1:{down}"},
            "tenants": {"a": {"requests": {"capacity": 1000, "refill_per_s": 100}}},
        }
        s = serving.Serving(config)
        try:
            started = time.time()
            for i in range(50):
                status, _ = self.post_to(s.base, "/v1/admit",
                                         {"key": f"k{i}", "route": "interactive", "input_tokens": 1,
                                          "max_output_tokens": 1,
                                          "deadline_ms": int(time.time() * 1000) + 60_000},
                                         "down-key")
                self.assertEqual(status, 200)
                status, _ = self.post_to(s.base, f"/v1/operations/k{i}/complete",
                                         {"result": "succeeded"}, "down-key")
                self.assertEqual(status, 200)
            self.assertLess(time.time() - started, 10)
            until = time.time() + 15
            while True:
                with urllib.request.urlopen(s.base + "/metrics") as r:
                    text = r.read().decode()
                dropped = sum(float(line.split()[-1]) for line in text.splitlines()
                              if line.startswith('tollgate_trace_spans_total{result="dropped'))
                if dropped > 0 or time.time() > until:
                    break
                time.sleep(0.2)
            self.assertGreater(dropped, 0, text)
            self.assertIn('tollgate_trace_spans_total{result="exported"} 0', text)
        finally:
            s.stop()

    def test_sampling_keeps_a_share_of_new_traces_and_follows_a_parent(self):
        config = {
            "auth": {"callers": {"rare-key": "a"}},
            "telemetry": {"otlp_endpoint": f"http://127.0.0.1:{self.receiver.server_address[1]}",
                          "sample_ratio": 0, "service_name": "sampled-never"},
            "tenants": {"a": {}},
        }
        s = serving.Serving(config)
        try:
            job = {"route": "durable", "input_tokens": 1, "max_output_tokens": 1,
                   "deadline_ms": int(time.time() * 1000) + 60_000}
            # A caller's sampled trace is kept whatever the ratio; a new trace is not.
            self.assertEqual(self.post_to(s.base, "/v1/admit", {**job, "key": "kept"}, "rare-key",
                                          {"traceparent": traceparent(10)})[0], 202)
            self.assertEqual(self.post_to(s.base, "/v1/admit", {**job, "key": "new"}, "rare-key")[0], 202)
            self.trace(TRACE + "0a", ["POST /v1/admit", "tollgate.admission"])
            time.sleep(1.5)
            with Receiver.lock:
                mine = {s.trace_id.hex() for svc, s in Receiver.spans
                        if svc.get("service.name") == "sampled-never"}
            self.assertEqual(mine, {TRACE + "0a"})
        finally:
            s.stop()

    def test_with_no_endpoint_no_span_is_built_or_sent(self):
        config = {"auth": {"callers": {"quiet-key": "a"}}, "tenants": {"a": {}}}
        s = serving.Serving(config, args=["--json-logs"])
        try:
            for i in range(3):
                status, _ = self.post_to(s.base, "/v1/admit",
                                         {"key": f"q{i}", "route": "durable", "input_tokens": 1,
                                          "max_output_tokens": 1,
                                          "deadline_ms": int(time.time() * 1000) + 60_000},
                                         "quiet-key", {"traceparent": traceparent(9)})
                self.assertEqual(status, 202)
            with urllib.request.urlopen(s.base + "/metrics") as r:
                text = r.read().decode()
            counts = [line for line in text.splitlines()
                      if line.startswith("tollgate_trace_spans_total{")]
            self.assertEqual(len(counts), 3, text)
            self.assertTrue(all(line.endswith(" 0") for line in counts), counts)
            time.sleep(0.5)
            with open(s.log_path) as f:
                lines = [json.loads(line) for line in f if line.startswith("{")]
            decisions = [line for line in lines if line.get("message") == "decision"]
            self.assertEqual(len(decisions), 3, lines)
            self.assertTrue(all("trace_id" not in line for line in decisions), decisions)
        finally:
            s.stop()

    def post_to(self, base, path, body, key, headers=None):
        saved, self.base = self.base, base
        try:
            return self.post(path, body, key, headers)
        finally:
            self.base = saved


if __name__ == "__main__":
    unittest.main(verbosity=2)
