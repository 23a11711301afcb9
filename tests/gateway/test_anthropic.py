"""Anthropic's Messages API as a user of the official `anthropic` Python SDK meets it: the
SDK pointed at `tollgate serve`, in front of a stub that speaks Anthropic's API
(anthropic_upstream.py). Run by tests/gateway.rs, which gives the `tollgate` executable in
TOLLGATE_BIN."""
import json
import os
import sys
import time
import unittest
import urllib.request

import anthropic

sys.path.insert(0, os.path.dirname(__file__))
import anthropic_upstream as stub  # noqa: E402
import serving  # noqa: E402

ADMIN = "admin-key"
KEYS = {"acme": "acme-key", "paced": "paced-key", "cut": "cut-key", "priced": "priced-key",
        "shrink": "shrink-key"}
MODEL = "claude-sonnet-4-5"
BOOKED_INPUT = stub.INPUT_TOKENS + stub.CACHE_WRITE_TOKENS + stub.CACHE_READ_TOKENS
# What an answer of the stub is booked as, by class.
BOOKED = {"input_tokens": BOOKED_INPUT, "output_tokens": stub.OUTPUT_TOKENS,
          "cached_input_tokens": stub.CACHE_READ_TOKENS,
          "cache_write_tokens": stub.CACHE_WRITE_TOKENS}
# Micro-dollars per token by class, and what one answer of the stub costs at them.
PRICE = {"input": 10, "output": 20, "cached_input": 1, "cache_write": 12.5}
COST = (stub.INPUT_TOKENS * 10 + stub.CACHE_READ_TOKENS * 1 + stub.CACHE_WRITE_TOKENS * 12.5
        + stub.OUTPUT_TOKENS * 20)



class Messages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub = stub.start()
        config = {
            "refund_unused_tokens": True,
            "auth": {"callers": {v: k for k, v in KEYS.items()}, "admins": [ADMIN]},
            "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 100},
            "tenant_defaults": {"requests": {"capacity": 1000, "refill_per_s": 0},
                                "tokens": {"capacity": 1000000, "refill_per_s": 0}},
            # One request a second: the second call at once waits for the next.
            # Too few tokens for a large max_tokens: the standard rules cut it to 50.
            "policy_params": {"degrade_on_token_shortage": True, "degraded_max_output_tokens": 50},
            "tenants": {"acme": {}, "cut": {},
                        "shrink": {"tokens": {"capacity": 300, "refill_per_s": 0}},
                        "priced": {"cost_microusd": {"capacity": 10000, "refill_per_s": 0}},
                        "paced": {"requests": {"capacity": 1, "refill_per_s": 1}}},
            "models": {MODEL: {"price_microusd_per_token": PRICE}, "gpt-4o-mini": {},
                       "claude-small": {}},
            "gateway": {
                "upstreams": {
                    "claude": {"kind": "anthropic",
                               "base_url": f"http://127.0.0.1:{cls.stub.server_address[1]}",
                               "api_key_env": "ANTHROPIC_STUB_KEY"},
                    "openai": {"base_url": "http://127.0.0.1:9/v1"},
                },
                "models": {MODEL: {"upstream": "claude", "default_max_output_tokens": 64},
                           # No call fits its deployment: its calls go to MODEL.
                           "claude-small": {"deployments": [
                               {"name": "tiny", "upstream": "claude",
                                "tokens": {"capacity": 1, "refill_per_s": 0}}],
                               "fallbacks": [MODEL]},
                           "gpt-4o-mini": {"upstream": "openai"}},
                "default_timeout_ms": 20000,
            },
        }
        cls.serving = serving.Serving(config, env=dict(ANTHROPIC_STUB_KEY="upstream-secret"))
        cls.base = cls.serving.base

    @classmethod
    def tearDownClass(cls):
        cls.serving.stop()
        cls.stub.shutdown()

    def client(self, tenant="acme", **kw):
        return anthropic.Anthropic(api_key=KEYS[tenant], base_url=self.base, **kw)

    def get(self, path, key):
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stub_calls(self, text=None, path="/v1/messages"):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stub.server_address[1]}/_calls") as r:
            calls = json.loads(r.read())
        return [c for c in calls if c["path"] == path
                and (text is None or stub.text_of(c["body"]) == text)]

    def tokens_left(self, tenant):
        return self.get("/v1/admin/inspect", ADMIN)[1]["buckets"][f"tenant.{tenant}.tokens"]

    def operation(self, key, tenant="acme"):
        return self.get(f"/v1/operations/{key}", KEYS[tenant])[1]

    def wait_for_state(self, key, tenant, state):
        for _ in range(100):
            op = self.operation(key, tenant)
            if op and op.get("state") == state:
                return op
            time.sleep(0.05)
        self.fail(f"{key} never reached {state}: {self.operation(key, tenant)}")

    def test_a_plain_message_books_every_input_token_and_sends_the_upstream_key_only(self):
        before = self.tokens_left("acme")
        raw = self.client().messages.with_raw_response.create(
            model=MODEL, max_tokens=50, system="be brief",
            messages=[{"role": "user", "content": "plain message"}],
            extra_headers={"Idempotency-Key": "m1"})
        message = raw.parse()
        self.assertEqual(message.content[0].text, stub.ANSWER)
        self.assertEqual(message.usage.cache_read_input_tokens, stub.CACHE_READ_TOKENS)
        op = self.operation("m1")
        self.assertEqual(op["state"], "succeeded")
        # Input, cache writes and cache reads are all input the provider processed.
        self.assertEqual(op["usage"], BOOKED)
        self.assertEqual(before - self.tokens_left("acme"), BOOKED_INPUT + stub.OUTPUT_TOKENS)
        self.assertEqual(op["max_output_tokens"], 50)
        self.assertIn("anthropic-ratelimit-tokens-remaining", raw.headers)
        self.assertTrue(raw.headers["anthropic-ratelimit-tokens-reset"].endswith("Z"))
        self.assertNotIn("x-ratelimit-remaining-tokens", raw.headers)
        call = self.stub_calls("plain message")[-1]
        self.assertEqual(call["x-api-key"], "upstream-secret")
        self.assertIsNone(call["authorization"])
        # The SDK's own API version is carried upstream.
        self.assertRegex(call["anthropic-version"], r"^\d{4}-\d{2}-\d{2}$")
        self.assertEqual(call["body"]["max_tokens"], 50)

    def test_the_gateways_headers_degradation_and_replay_work_on_messages(self):
        raw = self.client("shrink").messages.with_raw_response.create(
            model=MODEL, max_tokens=1000, messages=[{"role": "user", "content": "shrink me"}],
            extra_headers={"x-tollgate-priority": "standard", "x-tollgate-labels": "team=search",
                           "Idempotency-Key": "m-shrink"})
        self.assertEqual(raw.headers["x-tollgate-degraded"], "true")
        self.assertEqual(self.stub_calls("shrink me")[-1]["body"]["max_tokens"], 50)
        again = self.client("shrink").messages.with_raw_response.create(
            model=MODEL, max_tokens=1000, messages=[{"role": "user", "content": "shrink me"}],
            extra_headers={"x-tollgate-priority": "standard", "x-tollgate-labels": "team=search",
                           "Idempotency-Key": "m-shrink"})
        self.assertEqual(again.headers.get("x-tollgate-replayed"), "true")
        self.assertEqual(again.parse().id, raw.parse().id)
        self.assertEqual(len(self.stub_calls("shrink me")), 1)
        # The same key with another body is a conflict, in Anthropic's shape.
        with self.assertRaises(anthropic.APIStatusError) as caught:
            self.client("shrink").messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "other"}],
                extra_headers={"Idempotency-Key": "m-shrink"})
        self.assertEqual(caught.exception.status_code, 422)
        self.assertEqual(caught.exception.body["error"]["type"], "invalid_request_error")
        self.assertEqual(caught.exception.body["error"]["code"], "conflict")
        with self.assertRaises(anthropic.BadRequestError) as caught:
            self.client().messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "bad timeout"}],
                extra_headers={"x-tollgate-timeout-ms": "soon"})
        self.assertIn("x-tollgate-timeout-ms", caught.exception.body["error"]["message"])

    def test_a_fallback_model_serves_unless_forbidden(self):
        raw = self.client().messages.with_raw_response.create(
            model="claude-small", max_tokens=10,
            messages=[{"role": "user", "content": "fall back"}])
        self.assertEqual(raw.headers["x-tollgate-model"], MODEL)
        self.assertEqual(self.stub_calls("fall back")[-1]["body"]["model"], MODEL)
        with self.assertRaises(anthropic.RateLimitError) as caught:
            self.client(max_retries=0).messages.create(
                model="claude-small", max_tokens=10,
                messages=[{"role": "user", "content": "no fallback"}],
                extra_headers={"x-tollgate-fallback": "none"})
        self.assertEqual(caught.exception.body["error"]["code"], "deployment_capacity")
        self.assertEqual(self.stub_calls("no fallback"), [])

    def test_a_price_per_class_charges_the_money_budget_exactly(self):
        for stream in [False, True]:
            before = self.get("/v1/admin/inspect", ADMIN)[1]["buckets"]["tenant.priced.cost_microusd"]
            if stream:
                with self.client("priced").messages.stream(
                        model=MODEL, max_tokens=40,
                        messages=[{"role": "user", "content": "priced stream"}]) as s:
                    "".join(s.text_stream)
                time.sleep(0.2)
            else:
                self.client("priced").messages.create(
                    model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "priced"}])
            after = self.get("/v1/admin/inspect", ADMIN)[1]["buckets"]["tenant.priced.cost_microusd"]
            self.assertEqual(before - after, int(COST) + (COST % 1 > 0), stream)

    def test_a_streamed_message_books_the_start_input_and_the_final_output(self):
        before = self.tokens_left("acme")
        with self.client().messages.stream(
                model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "stream me"}],
                extra_headers={"Idempotency-Key": "m2"}) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(text, stub.ANSWER)
        self.assertEqual(final.usage.output_tokens, stub.OUTPUT_TOKENS)
        op = self.wait_for_state("m2", "acme", "succeeded")
        self.assertEqual(op["usage"], BOOKED)
        self.assertEqual(before - self.tokens_left("acme"), BOOKED_INPUT + stub.OUTPUT_TOKENS)

    def test_a_stream_cut_midway_raises_in_the_sdk_and_is_unknown(self):
        with self.assertRaises(anthropic.APIError):
            with self.client("cut").messages.stream(
                    model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "drop"}],
                    extra_headers={"Idempotency-Key": "m3"}) as s:
                for _ in s.text_stream:
                    pass
        self.wait_for_state("m3", "cut", "unknown")
        self.assertEqual(len(self.stub_calls("drop")), 1, "never retried")

    def test_count_tokens_passes_through_and_costs_nothing(self):
        before = self.tokens_left("acme")
        counted = self.client().messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "count me"}])
        self.assertEqual(counted.input_tokens, stub.COUNTED_TOKENS)
        self.assertEqual(self.tokens_left("acme"), before)
        call = self.stub_calls(path="/v1/messages/count_tokens")[-1]
        self.assertEqual(call["x-api-key"], "upstream-secret")
        with self.assertRaises(anthropic.AuthenticationError):
            anthropic.Anthropic(api_key="wrong", base_url=self.base).messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": "count me"}])

    def test_the_key_is_taken_from_x_api_key_or_a_bearer_token(self):
        bearer = anthropic.Anthropic(auth_token=KEYS["acme"], base_url=self.base)
        message = bearer.messages.create(model=MODEL, max_tokens=10,
                                         messages=[{"role": "user", "content": "bearer"}])
        self.assertEqual(message.content[0].text, stub.ANSWER)
        # A bare request (curl's) with x-api-key and no version: the default version goes.
        req = urllib.request.Request(
            self.base + "/v1/messages", method="POST",
            data=json.dumps({"model": MODEL, "max_tokens": 10,
                             "messages": [{"role": "user", "content": "curl"}]}).encode(),
            headers={"x-api-key": KEYS["acme"], "content-type": "application/json"})
        with urllib.request.urlopen(req) as r:
            self.assertEqual(json.loads(r.read())["content"][0]["text"], stub.ANSWER)
        self.assertEqual(self.stub_calls("curl")[-1]["anthropic-version"], "2023-06-01")
        with self.assertRaises(anthropic.AuthenticationError) as caught:
            anthropic.Anthropic(api_key="wrong", base_url=self.base).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "nope"}])
        self.assertEqual(caught.exception.body["type"], "error")
        self.assertEqual(caught.exception.body["error"]["type"], "authentication_error")

    def test_a_tenant_over_its_rate_gets_anthropics_rate_limit_error_and_the_sdk_waits(self):
        fast = self.client("paced", max_retries=0)
        fast.messages.create(model=MODEL, max_tokens=10,
                             messages=[{"role": "user", "content": "first"}])
        with self.assertRaises(anthropic.RateLimitError) as caught:
            fast.messages.create(model=MODEL, max_tokens=10,
                                 messages=[{"role": "user", "content": "second"}])
        e = caught.exception
        self.assertEqual(e.body["error"]["type"], "rate_limit_error")
        self.assertIn("tenant.paced.requests", e.body["error"]["message"])
        self.assertIn("retry-after", e.response.headers)
        self.assertEqual(e.response.headers["anthropic-ratelimit-requests-remaining"], "0")
        self.assertEqual(self.stub_calls("second"), [], "refused before the upstream")
        # The SDK's own retry waits the Retry-After and gets through.
        time.sleep(1.1)
        patient = self.client("paced", max_retries=3)
        patient.messages.create(model=MODEL, max_tokens=10,
                                messages=[{"role": "user", "content": "third"}])
        started = time.monotonic()
        message = patient.messages.create(model=MODEL, max_tokens=10,
                                          messages=[{"role": "user", "content": "fourth"}])
        self.assertEqual(message.content[0].text, stub.ANSWER)
        self.assertGreater(time.monotonic() - started, 0.5)

    def test_an_upstream_429_is_retried_by_the_gateway(self):
        message = self.client().messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "rate-limit-once a1"}],
            extra_headers={"Idempotency-Key": "a1"})
        self.assertEqual(message.content[0].text, stub.ANSWER)
        self.assertEqual(len(self.stub_calls("rate-limit-once a1")), 2)
        self.assertEqual(self.operation("a1")["attempt"], 2)

    def test_a_model_of_another_api_is_refused_on_each_route(self):
        with self.assertRaises(anthropic.BadRequestError) as caught:
            self.client().messages.create(model="gpt-4o-mini", max_tokens=10,
                                          messages=[{"role": "user", "content": "wrong api"}])
        self.assertIn("/v1/messages", caught.exception.body["error"]["message"])
        req = urllib.request.Request(
            self.base + "/v1/chat/completions", method="POST",
            data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
            headers={"Authorization": f"Bearer {KEYS['acme']}", "content-type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(req)
        self.assertEqual(http.exception.code, 400)
        self.assertEqual(self.stub_calls("wrong api"), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
