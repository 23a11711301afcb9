"""The gateway as an OpenAI SDK user meets it: the official `openai` Python client pointed
at `tollgate serve`, in front of the stub upstream (stub_upstream.py). Run by
tests/gateway.rs, which gives the `tollgate` executable in TOLLGATE_BIN."""
import json
import os
import sys
import time
import unittest
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(__file__))
import serving  # noqa: E402
import stub_upstream  # noqa: E402

ADMIN = "admin-key"
KEYS = {"acme": "acme-key", "globex": "globex-key", "tight": "tight-key", "slotty": "slotty-key",
        "shrink": "shrink-key", "priced": "priced-key"}
MODEL = "gpt-4o-mini"



class Gateway(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub = stub_upstream.start()
        stub_port = cls.stub.server_address[1]
        config = {
            "refund_unused_tokens": True,
            "auth": {"callers": {v: k for k, v in KEYS.items()}, "admins": [ADMIN]},
            "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 100},
            "tenant_defaults": {"requests": {"capacity": 1000, "refill_per_s": 0},
                                "tokens": {"capacity": 1000000, "refill_per_s": 0}},
            "tenants": {"acme": {}, "globex": {},
                        "tight": {"tokens": {"capacity": 100, "refill_per_s": 0}},
                        "shrink": {"tokens": {"capacity": 300, "refill_per_s": 0}},
                        "slotty": {"concurrency": 5},
                        "priced": {"cost_microusd": {"capacity": 100, "refill_per_s": 0}}},
            # The gateway's models, with their budgets and prices.
            "models": {MODEL: {"price_microusd_per_token": {"input": 1, "output": 1}},
                       "no-tokenizer": {}, "primary": {}, "two-places": {}},
            # A request that can never fit its token bucket is cut to 50 output tokens.
            "policy_params": {"degrade_on_token_shortage": True, "degraded_max_output_tokens": 50,
                              "exec_ms_per_output_token": 1, "shed_model": MODEL},
            # The standard rules, plus words for the caller: sheddable calls for MODEL are
            # refused, `tier=free` ones capped at 100 output tokens (policies/fixtures/shed-model).
            "policy": os.environ["TOLLGATE_SHED_MODEL_POLICY"],
            "gateway": {
                "upstreams": {"local": {"base_url": f"http://127.0.0.1:{stub_port}/v1",
                                        "api_key_env": "STUB_UPSTREAM_KEY"},
                              # The same stub as another provider account (its own key).
                              "second": {"base_url": f"http://127.0.0.1:{stub_port}/v1",
                                         "api_key_env": "STUB_UPSTREAM_KEY2"}},
                "models": {MODEL: {"upstream": "local", "tokenizer": "o200k_base",
                                   "default_max_output_tokens": 64},
                           "no-tokenizer": {"upstream": "local"},
                           # A deployment whose one-token bucket no call fits: its calls go
                           # to the fallback model, unless the caller forbids it.
                           "primary": {"deployments": [{"name": "tiny", "upstream": "local",
                                                        "tokens": {"capacity": 1, "refill_per_s": 0}}],
                                       "fallbacks": [MODEL], "tokenizer": "o200k_base"},
                           # Two accounts: a stored response lives at the one that made it.
                           "two-places": {"deployments": [{"name": "east", "upstream": "local"},
                                                          {"name": "west", "upstream": "second"}],
                                          "tokenizer": "o200k_base"}},
                "default_timeout_ms": 20000,
            },
        }
        cls.serving = serving.Serving(config, env=dict(STUB_UPSTREAM_KEY="upstream-secret",
                                                              STUB_UPSTREAM_KEY2="second-secret"))
        cls.base = cls.serving.base

    @classmethod
    def tearDownClass(cls):
        cls.serving.stop()
        cls.stub.shutdown()

    def client(self, tenant="acme", **kw):
        return openai.OpenAI(api_key=KEYS[tenant], base_url=self.base + "/v1", **kw)

    def get(self, path, key):
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stub_calls(self, content):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stub.server_address[1]}/_calls") as r:
            calls = json.loads(r.read())
        return [c for c in calls if stub_upstream.content_of(c["body"]) == content]

    def operation(self, key, tenant="acme"):
        return self.get(f"/v1/operations/{key}", KEYS[tenant])

    def inspect(self):
        return self.get("/v1/admin/inspect", ADMIN)[1]

    def wait_for_state(self, key, tenant, state):
        for _ in range(100):
            status, op = self.operation(key, tenant)
            if status == 200 and op["state"] == state:
                return op
            time.sleep(0.05)
        self.fail(f"{key} never reached {state}: {self.operation(key, tenant)}")

    def test_a_plain_answer_is_unchanged_and_its_usage_recorded(self):
        before = self.inspect()["buckets"]["tenant.globex.tokens"]
        raw = self.client("globex").chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "plain please"}],
            max_tokens=50, extra_headers={"Idempotency-Key": "plain-1"})
        answer = raw.parse()
        self.assertEqual(answer.choices[0].message.content, stub_upstream.ANSWER)
        self.assertEqual(answer.usage.prompt_tokens, stub_upstream.PROMPT_TOKENS)
        # Refunds follow the provider's usage: what is spent is what it reported.
        spent = before - self.inspect()["buckets"]["tenant.globex.tokens"]
        self.assertEqual(spent, stub_upstream.PROMPT_TOKENS + stub_upstream.COMPLETION_TOKENS)
        op = self.operation("plain-1", "globex")[1]
        self.assertEqual(op["state"], "succeeded")
        # The reported usage, by class, beside the reservation.
        self.assertEqual(op["usage"], stub_upstream.BOOKED)
        self.assertEqual(op["max_output_tokens"], 50)
        self.assertGreater(op["reserved_tokens"], op["usage"]["input_tokens"] + 2)
        listed = self.get("/v1/admin/operations?state=succeeded", ADMIN)[1]["operations"]
        mine = [o for o in listed if o["key"] == "plain-1"]
        self.assertEqual(mine[0]["usage"], op["usage"])
        for h in ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                  "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                  "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]:
            self.assertIn(h, raw.headers, h)
        self.assertEqual(raw.headers["x-ratelimit-limit-tokens"], "1000000")
        # The upstream saw its own key, never the caller's, and the caller's limit.
        call = self.stub_calls("plain please")[-1]
        self.assertEqual(call["authorization"], "Bearer upstream-secret")
        self.assertEqual(call["body"]["max_tokens"], 50)

    def test_a_stream_is_unchanged_and_carries_usage_only_when_asked(self):
        chunks = list(self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream please"}], stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, stub_upstream.ANSWER)
        self.assertTrue(all(c.usage is None for c in chunks), "usage chunk not asked for")
        # The gateway asked upstream for the usage all the same.
        self.assertTrue(self.stub_calls("stream please")[-1]["body"]["stream_options"]["include_usage"])
        chunks = list(self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream with usage"}], stream=True,
            stream_options={"include_usage": True}, extra_headers={"Idempotency-Key": "s-usage"}))
        self.assertEqual(chunks[-1].usage.completion_tokens, stub_upstream.COMPLETION_TOKENS)
        # Booked from the usage chunk, every class included.
        self.assertEqual(self.wait_for_state("s-usage", "acme", "succeeded")["usage"],
                         stub_upstream.BOOKED)

    def test_an_upstream_429_is_retried_by_the_gateway_not_the_sdk(self):
        answer = self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "rate-limit-once r1"}],
            extra_headers={"Idempotency-Key": "r1"})
        self.assertEqual(answer.choices[0].message.content, stub_upstream.ANSWER)
        self.assertEqual(len(self.stub_calls("rate-limit-once r1")), 2)
        status, op = self.operation("r1")
        self.assertEqual((status, op["state"], op["attempt"]), (200, "succeeded", 2))

    def test_a_final_upstream_failure_reaches_the_sdk_once(self):
        with self.assertRaises(openai.InternalServerError):
            self.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "unavailable"}],
                extra_headers={"Idempotency-Key": "u1"})
        # The policy's three attempts, by the gateway; the SDK did not add its own.
        self.assertEqual(len(self.stub_calls("unavailable")), 3)
        self.assertEqual(self.operation("u1")[1]["state"], "failed_final")

    def test_a_stream_cut_midway_leaves_the_operation_unknown_with_its_slot(self):
        with self.assertRaises(openai.APIError):
            for _ in self.client("slotty").chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "drop"}], stream=True,
                    extra_headers={"Idempotency-Key": "d1"}):
                pass
        op = self.wait_for_state("d1", "slotty", "unknown")
        self.assertEqual(op["state"], "unknown")
        self.assertEqual(self.inspect()["slots"]["tenant.slotty"], 1)
        self.assertEqual(len(self.stub_calls("drop")), 1, "never retried")

    def test_a_call_past_its_deadline_is_unknown_and_not_retried(self):
        with self.assertRaises(openai.APIStatusError) as caught:
            self.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "stall"}],
                extra_headers={"Idempotency-Key": "s1", "x-tollgate-timeout-ms": "500"})
        self.assertEqual(caught.exception.status_code, 502)
        self.assertEqual(caught.exception.code, "unknown_outcome")
        self.assertEqual(self.operation("s1")[1]["state"], "unknown")
        self.assertEqual(len(self.stub_calls("stall")), 1)

    def test_a_tenant_over_its_token_budget_gets_a_rate_limit_error(self):
        # A call whose outcome stays unknown keeps its tokens spent (no usage, no refund).
        with self.assertRaises(openai.APIStatusError):
            self.client("tight", max_retries=0).chat.completions.create(
                model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "stall tight"}],
                extra_headers={"x-tollgate-timeout-ms": "300"})
        left = self.inspect()["buckets"]["tenant.tight.tokens"]
        with self.assertRaises(openai.RateLimitError) as caught:
            self.client("tight").chat.completions.create(
                model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "tight two"}])
        headers = caught.exception.response.headers
        self.assertEqual(caught.exception.code, "token_budget")
        self.assertEqual(headers["x-tollgate-reason"], "token_budget")
        self.assertEqual(headers["x-ratelimit-limit-tokens"], "100")
        self.assertEqual(headers["x-ratelimit-remaining-tokens"], str(left))
        self.assertEqual(headers["x-should-retry"], "false", "the bucket does not refill")
        self.assertEqual(self.stub_calls("tight two"), [], "refused before the upstream")
        # The refusal explains itself: the budget, what was asked and what was there.
        body = caught.exception.body
        self.assertEqual(body["limit"], "tenant.tight.tokens")
        self.assertEqual(body["available"], left)
        self.assertGreater(body["requested"], left)
        self.assertEqual(body["message"],
                         f"token_budget: needs {body['requested']} tokens, {left} available in "
                         "tenant.tight.tokens; the budget does not refill, waiting cannot cure it")
        self.assertIn(f"{left} available in tenant.tight.tokens", str(caught.exception))

    def test_a_policys_words_reach_the_caller(self):
        with self.assertRaises(openai.APIStatusError) as caught:
            self.client(max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "shed me"}],
                extra_headers={"x-tollgate-priority": "sheddable"})
        e = caught.exception
        self.assertEqual((e.status_code, e.code), (503, "overloaded"))
        words = "sheddable work for this model is paused; send it as standard or later"
        self.assertEqual(e.body["policy_message"], words)
        self.assertEqual(e.body["message"], f"overloaded: {words}; retry in 5.0 s")
        self.assertIn(words, str(e))
        self.assertEqual(self.stub_calls("shed me"), [])
        # A degradation's words come with the answer.
        raw = self.client().chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=500, messages=[{"role": "user", "content": "free please"}],
            extra_headers={"x-tollgate-labels": "tier=free"})
        self.assertEqual(raw.parse().choices[0].message.content, stub_upstream.ANSWER)
        self.assertEqual(raw.headers["x-tollgate-degraded"], "true")
        self.assertEqual(raw.headers["x-tollgate-policy-message"],
                         "free tier: output capped at 100 tokens")
        self.assertEqual(self.stub_calls("free please")[-1]["body"]["max_tokens"], 100)

    def test_an_unmeetable_deadline_is_a_client_error_with_its_numbers(self):
        # 5,000 output tokens at 1 ms each cannot finish in a 2 s timeout: the request as sent
        # cannot be served, so it is a 400 the SDK does not retry, never a server error.
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client().chat.completions.create(
                model=MODEL, max_tokens=5000, messages=[{"role": "user", "content": "too long"}],
                extra_headers={"x-tollgate-timeout-ms": "2000"})
        e = caught.exception
        self.assertEqual(e.code, "deadline_exceeded")
        self.assertEqual(e.response.headers["x-tollgate-reason"], "deadline_exceeded")
        self.assertEqual(e.response.headers["x-should-retry"], "false")
        self.assertEqual((e.body["limit"], e.body["requested"]), ("deadline", 5000))
        self.assertLessEqual(e.body["available"], 2000)
        self.assertRegex(e.body["message"],
                         r"^deadline_exceeded: estimated 5\.0 s for 5,000 output tokens, deadline in [12]\.\d s$")
        self.assertEqual(self.stub_calls("too long"), [])

    def test_a_degraded_plan_rewrites_the_limit_sent_upstream(self):
        raw = self.client("shrink").chat.completions.with_raw_response.create(
            model=MODEL, max_completion_tokens=500,
            messages=[{"role": "user", "content": "make it short"}])
        self.assertEqual(raw.parse().choices[0].message.content, stub_upstream.ANSWER)
        self.assertEqual(raw.headers["x-tollgate-degraded"], "true")
        self.assertEqual(self.stub_calls("make it short")[-1]["body"]["max_completion_tokens"], 50)
        # The same on the Responses route: the plan's limit goes upstream as max_output_tokens.
        raw = self.client("shrink").responses.with_raw_response.create(
            model=MODEL, max_output_tokens=500, input="make it shorter",
            extra_headers={"x-tollgate-priority": "standard", "x-tollgate-labels": "team=search"})
        self.assertEqual(raw.headers["x-tollgate-degraded"], "true")
        self.assertEqual(self.stub_calls("make it shorter")[-1]["body"]["max_output_tokens"], 50)

    def test_tenants_never_see_each_others_operations(self):
        for tenant in ["acme", "globex"]:
            self.client(tenant).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"mine, says {tenant}"}],
                extra_headers={"Idempotency-Key": "shared-key"})
        self.assertEqual(self.operation("shared-key", "acme")[1]["state"], "succeeded")
        self.assertEqual(self.operation("shared-key", "globex")[1]["state"], "succeeded")
        self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "acme only"}],
            extra_headers={"Idempotency-Key": "acme-only"})
        self.assertEqual(self.operation("acme-only", "globex")[0], 404)

    def test_a_repeated_key_is_replayed_or_a_conflict(self):
        ask = lambda content: self.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}],
            extra_headers={"Idempotency-Key": "again"})
        first = ask("once")
        # The SDK's retry after a lost answer gets the first answer, not a 409.
        again = ask("once")
        self.assertEqual(again.headers["x-tollgate-replayed"], "true")
        self.assertNotIn("x-tollgate-replayed", first.headers)
        self.assertEqual(again.parse().id, first.parse().id)
        self.assertEqual(again.http_response.content, first.http_response.content)
        with self.assertRaises(openai.UnprocessableEntityError) as caught:
            ask("something else")
        self.assertEqual(caught.exception.code, "conflict")
        self.assertEqual(len(self.stub_calls("once")), 1)
        # Streamed: the same events again.
        stream = lambda: list(self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream again"}], stream=True,
            extra_headers={"Idempotency-Key": "again-stream"}))
        one, two = stream(), stream()
        self.assertEqual([c.model_dump() for c in one], [c.model_dump() for c in two])
        self.assertEqual(len(self.stub_calls("stream again")), 1)

    def test_models_and_unknown_models(self):
        ids = sorted(m.id for m in self.client().models.list())
        self.assertEqual(ids, sorted([MODEL, "no-tokenizer", "primary", "two-places"]))
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client().chat.completions.create(
                model="gpt-nothing", messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(caught.exception.code, "model_not_found")
        self.assertIn("x-ratelimit-remaining-tokens", caught.exception.response.headers)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client().chat.completions.create(
                model=MODEL, n=2, messages=[{"role": "user", "content": "two please"}])
        self.assertEqual(self.stub_calls("two please"), [])
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(api_key="nobody", base_url=self.base + "/v1").models.list()

    def test_a_model_price_spends_the_tenants_money_budget_and_headers_set_priority_and_labels(self):
        with self.assertRaises(openai.RateLimitError) as caught:
            self.client("priced", max_retries=0).chat.completions.create(
                model=MODEL, max_tokens=500, messages=[{"role": "user", "content": "too dear"}])
        self.assertEqual(caught.exception.code, "cost_budget")
        self.assertEqual(self.stub_calls("too dear"), [], "refused before the upstream")
        self.assertEqual(self.inspect()["buckets"]["tenant.priced.cost_microusd"], 100)
        answer = self.client("priced").chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "cheap"}],
            extra_headers={"x-tollgate-priority": "critical", "x-tollgate-labels": "tier=gold"})
        self.assertEqual(answer.parse().choices[0].message.content, stub_upstream.ANSWER)
        # Spent at the reported usage's price (refunds are on): below the full reservation.
        left = self.inspect()["buckets"]["tenant.priced.cost_microusd"]
        usage = answer.parse().usage
        self.assertEqual(left, 100 - usage.prompt_tokens - usage.completion_tokens)
        for headers in [{"x-tollgate-priority": "urgent"}, {"x-tollgate-labels": "novalue"}]:
            with self.assertRaises(openai.BadRequestError):
                self.client("priced").chat.completions.create(
                    model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "bad header"}],
                    extra_headers=headers)
        self.assertEqual(self.stub_calls("bad header"), [])

    def test_a_caller_leaving_mid_stream_does_not_make_the_outcome_unknown(self):
        stream = self.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "slow-stream"}], stream=True,
            extra_headers={"Idempotency-Key": "leaver"})
        next(iter(stream))
        stream.close()
        self.wait_for_state("leaver", "acme", "succeeded")

    def tokens_left(self, tenant):
        return self.inspect()["buckets"][f"tenant.{tenant}.tokens"]

    def test_a_responses_call_reserves_its_output_limit_and_books_its_usage(self):
        before = self.tokens_left("globex")
        raw = self.client("globex").responses.with_raw_response.create(
            model=MODEL, input="responses plain", instructions="be brief", max_output_tokens=40,
            extra_headers={"Idempotency-Key": "resp-1"})
        answer = raw.parse()
        self.assertEqual(answer.output_text, stub_upstream.ANSWER)
        self.assertEqual(answer.usage.input_tokens, stub_upstream.PROMPT_TOKENS)
        self.assertEqual(before - self.tokens_left("globex"),
                         stub_upstream.PROMPT_TOKENS + stub_upstream.COMPLETION_TOKENS)
        op = self.operation("resp-1", "globex")[1]
        self.assertEqual(op["state"], "succeeded")
        self.assertEqual(op["usage"], stub_upstream.BOOKED)
        self.assertEqual(op["max_output_tokens"], 40)
        self.assertIn("x-ratelimit-remaining-tokens", raw.headers)
        call = self.stub_calls("responses plain")[-1]
        self.assertEqual(call["path"], "/v1/responses")
        self.assertEqual(call["authorization"], "Bearer upstream-secret")
        self.assertEqual(call["body"]["max_output_tokens"], 40)
        # No limit given: the model's default is reserved and written upstream.
        self.client().responses.create(model=MODEL, input="responses default")
        self.assertEqual(self.stub_calls("responses default")[-1]["body"]["max_output_tokens"], 64)
        # The stored response, read and deleted by its own tenant.
        self.assertEqual(self.client("globex").responses.retrieve(answer.id).output_text,
                         stub_upstream.ANSWER)
        self.client("globex").responses.delete(answer.id)
        with self.assertRaises(openai.NotFoundError):
            self.client("globex").responses.retrieve(answer.id)
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(api_key="wrong", base_url=self.base + "/v1").responses.retrieve("resp_1")
        # A repeat with the same key is its answer again, not a second call.
        again = self.client("globex").responses.with_raw_response.create(
            model=MODEL, input="responses plain", instructions="be brief", max_output_tokens=40,
            extra_headers={"Idempotency-Key": "resp-1"})
        self.assertEqual(again.headers.get("x-tollgate-replayed"), "true")
        self.assertEqual(again.parse().id, answer.id)
        self.assertEqual(len(self.stub_calls("responses plain")), 1)

    def stored_calls(self, rid):
        """The calls the upstream got for stored response `rid` (reads and deletes)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stub.server_address[1]}/_calls") as r:
            calls = json.loads(r.read())
        return [c for c in calls if c["path"].split("?")[0].startswith(f"/v1/responses/{rid}")]

    def test_a_stored_response_is_its_tenants_alone_at_the_deployment_that_holds_it(self):
        # Made until one is held by the second account in name order ("west").
        held = {}
        for n in range(16):
            raw = self.client().responses.with_raw_response.create(
                model="two-places", input=f"keep me {n}")
            held[raw.headers["x-tollgate-deployment"]] = raw.parse().id
            if "west" in held:
                break
        mine = held["west"]
        # Another tenant: 404 on read and delete, and the upstream is never asked.
        with self.assertRaises(openai.NotFoundError):
            self.client("globex").responses.retrieve(mine)
        with self.assertRaises(openai.NotFoundError):
            self.client("globex").responses.delete(mine)
        with self.assertRaises(openai.NotFoundError):
            self.client("globex").responses.input_items.list(mine)
        self.assertEqual(self.stored_calls(mine), [])
        # An id tollgate never served is nobody's: 404, nothing asked.
        with self.assertRaises(openai.NotFoundError):
            self.client().responses.retrieve("resp_nobody_made_this")
        self.assertEqual(self.stored_calls("resp_nobody_made_this"), [])
        # The owner's read goes to the account that holds it, once, query string and all.
        got = self.client().responses.retrieve(mine, include=["message.output_text.logprobs"])
        self.assertEqual(got.id, mine)
        calls = self.stored_calls(mine)
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["method"], "GET")
        self.assertEqual(calls[0]["authorization"], "Bearer second-secret")
        self.assertIn("include", calls[0]["path"])
        # A streamed response is recorded before its events reach the caller.
        events = list(self.client("globex").responses.create(
            model="two-places", input="keep my stream", stream=True))
        theirs = events[0].response.id
        with self.assertRaises(openai.NotFoundError):
            self.client().responses.retrieve(theirs)
        self.assertEqual(self.stored_calls(theirs), [])
        self.assertEqual(self.client("globex").responses.retrieve(theirs).id, theirs)
        # A call that asks the provider not to keep it leaves nothing to fetch.
        unkept = self.client().responses.create(model=MODEL, input="forget me", store=False).id
        with self.assertRaises(openai.NotFoundError):
            self.client().responses.retrieve(unkept)
        self.assertEqual(self.stored_calls(unkept), [])
        # The owner deletes it at its account; then it is gone for everyone, nothing asked.
        self.client().responses.delete(mine)
        self.assertEqual([c["method"] for c in self.stored_calls(mine)], ["GET", "DELETE"])
        self.assertEqual(self.stored_calls(mine)[1]["authorization"], "Bearer second-secret")
        with self.assertRaises(openai.NotFoundError):
            self.client().responses.retrieve(mine)
        self.assertEqual(len(self.stored_calls(mine)), 2)

    def test_a_responses_stream_passes_its_events_and_books_the_completed_usage(self):
        before = self.tokens_left("globex")
        events = list(self.client("globex").responses.create(
            model=MODEL, input="responses stream", stream=True,
            extra_headers={"Idempotency-Key": "resp-s1"}))
        types = [e.type for e in events]
        self.assertEqual((types[0], types[-1]), ("response.created", "response.completed"))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, stub_upstream.ANSWER)
        op = self.wait_for_state("resp-s1", "globex", "succeeded")
        self.assertEqual(op["usage"], stub_upstream.BOOKED)
        self.assertEqual(before - self.tokens_left("globex"),
                         stub_upstream.PROMPT_TOKENS + stub_upstream.COMPLETION_TOKENS)
        # No chat options are added to a Responses stream.
        self.assertNotIn("stream_options", self.stub_calls("responses stream")[-1]["body"])

    def test_a_responses_stream_cut_midway_is_unknown_and_ends_with_an_error_event(self):
        events = list(self.client().responses.create(
            model=MODEL, input="drop responses", stream=True,
            extra_headers={"Idempotency-Key": "resp-d1"}))
        self.assertEqual(events[-1].type, "error")
        self.assertEqual(events[-1].code, "unknown_outcome")
        self.wait_for_state("resp-d1", "acme", "unknown")
        self.assertEqual(len(self.stub_calls("drop responses")), 1, "never retried")

    def test_a_fallback_model_serves_responses_and_embeddings_unless_forbidden(self):
        raw = self.client().responses.with_raw_response.create(
            model="primary", input="fall back, responses", max_output_tokens=20)
        self.assertEqual(raw.headers["x-tollgate-model"], MODEL)
        self.assertEqual(self.stub_calls("fall back, responses")[-1]["body"]["model"], MODEL)
        raw = self.client().embeddings.with_raw_response.create(
            model="primary", input="fall back, embeddings")
        self.assertEqual(raw.headers["x-tollgate-model"], MODEL)
        for call in [lambda h: self.client(max_retries=0).responses.create(
                         model="primary", input="no fallback", extra_headers=h),
                     lambda h: self.client(max_retries=0).embeddings.create(
                         model="primary", input="no fallback", extra_headers=h)]:
            with self.assertRaises(openai.RateLimitError) as caught:
                call({"x-tollgate-fallback": "none"})
            self.assertEqual(caught.exception.code, "deployment_capacity")
        self.assertEqual(self.stub_calls("no fallback"), [])

    def test_a_deadline_header_bounds_every_route(self):
        for call in [lambda: self.client(max_retries=0).responses.create(
                         model=MODEL, input="stall responses",
                         extra_headers={"x-tollgate-timeout-ms": "500", "Idempotency-Key": "dl-r"}),
                     lambda: self.client(max_retries=0).embeddings.create(
                         model=MODEL, input="x", extra_headers={"x-tollgate-timeout-ms": "0"})]:
            with self.assertRaises(openai.APIStatusError):
                call()
        # The Responses call outlived its deadline upstream: unknown, never retried.
        self.assertEqual(self.operation("dl-r")[1]["state"], "unknown")
        self.assertEqual(len(self.stub_calls("stall responses")), 1)

    def test_embeddings_are_counted_exactly_and_book_the_reported_usage(self):
        before = self.tokens_left("globex")
        raw = self.client("globex").embeddings.with_raw_response.create(
            model=MODEL, input=["one two", "three"], extra_headers={"Idempotency-Key": "emb-1"})
        answer = raw.parse()
        self.assertEqual([d.index for d in answer.data], [0, 1])
        self.assertAlmostEqual(answer.data[1].embedding[0], 0.5)
        reported = 3
        self.assertEqual(answer.usage.prompt_tokens, reported)
        op = self.operation("emb-1", "globex")[1]
        self.assertEqual(op["usage"], {"input_tokens": reported, "output_tokens": 0})
        # Counted with o200k_base before the call: "one two" 2 tokens, "three" 1, and the
        # one output token an admission holds.
        self.assertEqual(op["reserved_tokens"], 3 + 1)
        # The one output token returns: what is spent is what the provider reported.
        self.assertEqual(before - self.tokens_left("globex"), reported)
        call = [c for c in self.stub_calls("one two") if c["path"] == "/v1/embeddings"][-1]
        self.assertEqual(call["authorization"], "Bearer upstream-secret")
        self.assertNotIn("max_tokens", call["body"])
        # Token arrays count by their length.
        self.client("globex").embeddings.create(
            model=MODEL, input=[[1, 2, 3], [4, 5]], extra_headers={"Idempotency-Key": "emb-2"})
        self.assertEqual(self.operation("emb-2", "globex")[1]["reserved_tokens"], 5 + 1)
        with self.assertRaises(openai.BadRequestError):
            self.client().embeddings.create(model=MODEL, input=[])
        # An input its tenant's tokens can never hold is refused before the upstream,
        # saying so.
        with self.assertRaises(openai.APIStatusError) as caught:
            self.client("tight", max_retries=0).embeddings.create(
                model=MODEL, input=["word " * 200])
        self.assertEqual(caught.exception.status_code, 413)
        self.assertIn("tenant.tight.tokens", caught.exception.message)
        self.assertEqual([c for c in self.stub_calls("word " * 200)], [])

if __name__ == "__main__":
    unittest.main(verbosity=2)
