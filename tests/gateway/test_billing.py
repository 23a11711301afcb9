"""Budgets the way people bill, as an OpenAI SDK user and an operator meet them: groups of
tenants with period budgets (a month in Paris, a day), refusals that name the group's
budget, answers that say what money is left and when it resets, groups changed through the
admin API, and the spend ledger read back as JSON, as CSV and with `tollgate spend`. Run by
tests/gateway.rs, which gives the `tollgate` executable in TOLLGATE_BIN."""
import csv
import datetime
import io
import json
import os
import subprocess
import sys
import unittest
import urllib.request
from zoneinfo import ZoneInfo

import openai

sys.path.insert(0, os.path.dirname(__file__))
import serving  # noqa: E402
import stub_upstream  # noqa: E402

ADMIN = "admin-key"
KEYS = {"a": "a-key", "b": "b-key", "c": "c-key", "solo": "solo-key"}
MODEL = "gpt-4o-mini"
ORG_LIMIT = 5_000_000


class Billing(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub = stub_upstream.start()
        stub_port = cls.stub.server_address[1]
        cls.config = {
            "refund_unused_tokens": True,
            "auth": {"callers": {v: k for k, v in KEYS.items()}, "admins": [ADMIN]},
            "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 100},
            "models": {MODEL: {"price_microusd_per_token": {"input": 2, "output": 3,
                                                            "cached_input": 1}}},
            "groups": {
                "org": {"budgets": {"cost_microusd": {"limit": ORG_LIMIT, "period": "month",
                                                      "timezone": "Europe/Paris"}}},
                "team": {"parent": "org", "budgets": {"requests": {"limit": 1000, "period": "day"}}},
                "small": {"parent": "org", "budgets": {"requests": {"limit": 2, "period": "day"}}},
            },
            "tenants": {"a": {"group": "team"}, "b": {"group": "team"}, "c": {"group": "small"},
                        "solo": {"cost_microusd": {"capacity": 1000000, "refill_per_s": 0}}},
            "gateway": {
                "upstreams": {"local": {"base_url": f"http://127.0.0.1:{stub_port}/v1",
                                        "api_key_env": "STUB_UPSTREAM_KEY"}},
                "models": {MODEL: {"upstream": "local", "tokenizer": "o200k_base",
                                   "default_max_output_tokens": 64}},
            },
        }
        cls.serving = serving.Serving(cls.config, env=dict(STUB_UPSTREAM_KEY="upstream-secret"))
        cls.base = cls.serving.base
        for tenant in ["a", "a", "b", "solo"]:
            cls.chat(tenant, "warm up")

    @classmethod
    def tearDownClass(cls):
        cls.serving.stop()
        cls.stub.shutdown()

    @classmethod
    def chat(cls, tenant, content, **kw):
        client = openai.OpenAI(api_key=KEYS[tenant], base_url=cls.base + "/v1", max_retries=0)
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=20, **kw)

    def call(self, method, path, body=None, key=ADMIN, accept=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        if accept:
            headers["Accept"] = accept
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers

    def json_of(self, method, path, body=None, key=ADMIN):
        status, data, _ = self.call(method, path, body, key)
        return status, json.loads(data or b"null")

    def inspect(self):
        return self.json_of("GET", "/v1/admin/inspect")[1]

    def succeeded(self):
        ops = self.json_of("GET", "/v1/admin/operations?state=succeeded&limit=1000")[1]
        return ops["operations"]

    def test_answers_say_what_money_is_left_and_when_it_resets(self):
        raw = self.chat("a", "how much is left")
        self.assertEqual(raw.parse().choices[0].message.content, stub_upstream.ANSWER)
        left = int(raw.headers["x-tollgate-budget-remaining-microusd"])
        # Tenant a has no money budget of its own: the org's month is the tightest. The
        # header tells it once the call's price is reserved; the usage then refunds some.
        after = self.inspect()["buckets"]["group.org.cost_microusd"]
        self.assertLessEqual(left, after)
        self.assertLess(after - left, 300)
        self.assertLess(left, ORG_LIMIT)
        resets = datetime.datetime.fromisoformat(raw.headers["x-tollgate-budget-resets"])
        paris = resets.astimezone(ZoneInfo("Europe/Paris"))
        self.assertEqual((paris.day, paris.hour, paris.minute), (1, 0, 0), paris)
        self.assertGreater(resets, datetime.datetime.now(datetime.timezone.utc))
        # Solo's own budget, which refills never: what is left, and no reset.
        raw = self.chat("solo", "solo money")
        left = int(raw.headers["x-tollgate-budget-remaining-microusd"])
        after = self.inspect()["buckets"]["tenant.solo.cost_microusd"]
        self.assertLessEqual(left, after)
        self.assertLess(after - left, 300)
        self.assertNotIn("x-tollgate-budget-resets", raw.headers)

    def test_a_group_refusal_names_the_group_and_its_reset(self):
        for i in range(2):
            self.chat("c", f"small {i}")
        with self.assertRaises(openai.RateLimitError) as refused:
            self.chat("c", "small 3")
        e = refused.exception
        self.assertEqual(e.response.headers["x-tollgate-reason"], "group_budget")
        self.assertIn("group.small.requests", e.message)
        self.assertEqual(e.body["limit"], "group.small.requests")
        # The retry-after is the time to the next UTC midnight.
        now = datetime.datetime.now(datetime.timezone.utc)
        midnight = (now + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0,
                                                               microsecond=0)
        wait = int(e.response.headers["retry-after"])
        self.assertLessEqual(abs(wait - (midnight - now).total_seconds()), 5)
        # The team's tenants are not touched by their sibling's budget.
        self.chat("a", "team is fine")

    def test_groups_change_through_the_admin_api(self):
        status, made = self.json_of("PUT", "/v1/admin/groups/pilot", {
            "parent": "org", "budgets": {"requests": {"limit": 1, "period": "hour"}}})
        self.assertEqual(status, 200, made)
        self.assertEqual(made["chain"], ["pilot", "org"])
        status, got = self.json_of("GET", "/v1/admin/groups/pilot")
        self.assertEqual(got["config"]["budgets"]["requests"],
                         {"limit": 1.0, "period": "hour", "timezone": "UTC"})
        self.assertEqual(self.json_of("PUT", "/v1/admin/tenants/d", {"group": "pilot"})[0], 200)
        status, key = self.json_of("POST", "/v1/admin/keys", {"role": "caller", "tenant": "d"})
        KEYS["d"] = key["key"]
        self.chat("d", "pilot one")
        with self.assertRaises(openai.RateLimitError) as refused:
            self.chat("d", "pilot two")
        self.assertEqual(refused.exception.body["limit"], "group.pilot.requests")
        self.assertIn("group.pilot.requests", self.inspect()["resets_at"])
        # Bad groups are refused with the field named, and change nothing.
        status, bad = self.json_of("PUT", "/v1/admin/groups/odd", {
            "budgets": {"tokens": {"limit": 5, "period": "day", "timezone": "Mars/Base"}}})
        self.assertEqual(status, 400, bad)
        self.assertIn("timezone", bad["message"])
        self.assertEqual(self.json_of("PUT", "/v1/admin/groups/loop1", {"parent": "pilot"})[0], 200)
        status, bad = self.json_of("PUT", "/v1/admin/groups/pilot", {"parent": "loop1"})
        self.assertEqual(status, 400, bad)
        self.assertIn("cycle", bad["message"])
        # Four levels are allowed, five are not.
        self.assertEqual(self.json_of("PUT", "/v1/admin/groups/deep", {"parent": "loop1"})[0], 200)
        status, bad = self.json_of("PUT", "/v1/admin/groups/deeper", {"parent": "deep"})
        self.assertEqual(status, 400, bad)
        self.assertIn("at most 4", bad["message"])
        self.assertEqual(self.json_of("DELETE", "/v1/admin/groups/deep")[0], 200)
        self.assertEqual(self.json_of("GET", "/v1/admin/groups/odd")[0], 404)
        # The file's groups are the file's; a group in use stays.
        status, owned = self.json_of("PUT", "/v1/admin/groups/org", {})
        self.assertEqual((status, owned["reason"]), (409, "owned_by_configuration"))
        status, busy = self.json_of("DELETE", "/v1/admin/groups/pilot")
        self.assertEqual((status, busy["reason"]), (409, "group_in_use"), busy)
        self.assertEqual(self.json_of("DELETE", "/v1/admin/groups/loop1")[0], 200)

    def test_the_spend_ledger_equals_the_usage_and_each_level_its_budget(self):
        self.chat("b", "ledger check")
        ops = self.succeeded()
        status, by_tenant = self.json_of("GET", "/v1/admin/spend?group_by=tenant")
        self.assertEqual(status, 200, by_tenant)
        rows = {r["tenant"]: r for r in by_tenant["rows"]}
        for tenant in {o["tenant"] for o in ops}:
            mine = [o for o in ops if o["tenant"] == tenant]
            self.assertEqual(rows[tenant]["calls"], len(mine), tenant)
            for field in ["input_tokens", "output_tokens", "cached_input_tokens",
                          "reasoning_tokens"]:
                self.assertEqual(rows[tenant][field],
                                 sum(o["usage"].get(field, 0) for o in mine), (tenant, field))
        # Each call cost its usage at the model's price, cached input at its own.
        u = stub_upstream.BOOKED
        one = (u["input_tokens"] - u["cached_input_tokens"]) * 2 + u["cached_input_tokens"] + \
            u["output_tokens"] * 3
        self.assertEqual(rows["a"]["cost_microusd"], one * rows["a"]["calls"])
        # The org's ledger is its bucket's spend, to the micro-dollar.
        status, by_group = self.json_of("GET", "/v1/admin/spend?group_by=group")
        groups = {r["group"]: r for r in by_group["rows"]}
        spent = ORG_LIMIT - self.inspect()["buckets"]["group.org.cost_microusd"]
        self.assertEqual(groups["org"]["cost_microusd"], spent)
        self.assertEqual(groups["org"]["calls"],
                         sum(r["calls"] for t, r in rows.items() if t != "solo"))
        self.assertEqual(by_tenant["total"]["cost_microusd"],
                         sum(r["cost_microusd"] for r in rows.values()))
        # CSV with a header row, the same figures.
        status, body, headers = self.call("GET", "/v1/admin/spend?group_by=tenant",
                                          accept="text/csv")
        self.assertTrue(headers["content-type"].startswith("text/csv"))
        table = list(csv.DictReader(io.StringIO(body.decode())))
        self.assertEqual({r["tenant"]: int(r["cost_microusd"]) for r in table},
                         {t: r["cost_microusd"] for t, r in rows.items()})
        # By day and by model; bad parameters are named.
        status, by_day = self.json_of("GET", "/v1/admin/spend?group_by=day&from=2020-01-01")
        self.assertEqual(by_day["total"], by_tenant["total"])
        status, bad = self.json_of("GET", "/v1/admin/spend?group_by=week")
        self.assertEqual(status, 400)
        self.assertIn("group_by", bad["message"])
        status, bad = self.json_of("GET", "/v1/admin/spend?from=yesterday")
        self.assertIn("from", bad["message"])
        self.assertEqual(self.json_of("GET", "/v1/admin/spend", key=KEYS["a"])[0], 403)
        # `tollgate spend` reads the same from the store.
        out = subprocess.run(
            [os.environ["TOLLGATE_BIN"], "spend", "--db",
             os.path.join(self.serving.dir.name, "state.db"), "--group-by", "model", "--csv"],
            capture_output=True, text=True, check=True).stdout
        table = list(csv.DictReader(io.StringIO(out)))
        self.assertEqual(table[0]["model"], MODEL)
        self.assertEqual(int(table[0]["cost_microusd"]), by_tenant["total"]["cost_microusd"])


if __name__ == "__main__":
    unittest.main()
