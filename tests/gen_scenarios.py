"""Writes the project's own scenario files (tests/scenarios/*.json).

The scenarios are data; this script only saves typing. Run it after editing, and commit both.
"""
import json, os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")

def req(tenant, key, route="interactive", i=100, o=100, deadline=60000, **extra):
    r = {"tenant": tenant, "key": key, "route": route, "input_tokens": i,
         "max_output_tokens": o, "deadline_ms": deadline}
    r.update(extra)
    return r

def admit(at, request, **expect):
    s = {"at_ms": at, "op": "admit", "request": request}
    if expect: s["expect"] = expect
    return s

def complete(at, tenant, key, result, expect=None, **extra):
    s = {"at_ms": at, "op": "complete", "tenant": tenant, "key": key, "result": result}
    s.update(extra)
    if expect is not None: s["expect"] = expect
    return s

def reconcile(at, tenant, key, resolution, expect=None, **extra):
    s = {"at_ms": at, "op": "reconcile", "tenant": tenant, "key": key, "resolution": resolution}
    s.update(extra)
    if expect is not None: s["expect"] = expect
    return s

def dispatch(at, worker, count, **expect):
    s = {"at_ms": at, "op": "dispatch", "worker": worker, "count": count}
    if expect: s["expect"] = expect
    return s

def inspect(at, **expect):
    return {"at_ms": at, "op": "inspect", "expect": expect}

def jobs(*pairs):
    return [{"tenant": t, "key": k} for t, k in pairs]

SCENARIOS = {}

def scenario(name, description, config, steps, policy=None):
    s = {"name": name, "description": description, "config": config, "steps": steps}
    if policy: s["policy"] = policy
    SCENARIOS[name] = s

# --- budgets ---------------------------------------------------------------------------
scenario("fractional-refill", "A bucket refilling 0.5 credits per second is exact: one credit takes 2000 ms.",
    {"tenant_defaults": {"requests": {"capacity": 1, "refill_per_s": 0.5}}, "tenants": {"acme": {}}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     admit(0, req("acme", "k2"), outcome="rejected", reason="tenant_rate", http=429, retry_after_ms=2000),
     admit(1999, req("acme", "k2"), outcome="rejected", reason="tenant_rate", retry_after_ms=1),
     admit(2000, req("acme", "k2"), outcome="accepted"),
     inspect(2000, buckets={"tenant.acme.requests": 0})])

scenario("global-rate-and-order", "The global request bucket is shared by tenants; when several budgets are short the tenant reason comes first and retry-after covers every short bucket.",
    {"global": {"requests": {"capacity": 2, "refill_per_s": 1}},
     "tenant_defaults": {"requests": {"capacity": 1, "refill_per_s": 0.25}},
     "tenants": {"a": {}, "b": {}, "c": {}}},
    [admit(0, req("a", "k1"), outcome="accepted"),
     admit(0, req("b", "k1"), outcome="accepted"),
     admit(0, req("c", "k1"), outcome="rejected", reason="global_rate", http=503, retry_after_ms=1000),
     admit(0, req("a", "k2"), outcome="rejected", reason="tenant_rate", http=429, retry_after_ms=4000),
     inspect(0, buckets={"global.requests": 0, "tenant.a.requests": 0, "tenant.c.requests": 1})])

scenario("no-refill-cannot-be-cured", "A bucket that never refills refuses without a retry-after: waiting cannot cure it.",
    {"tenant_defaults": {"requests": {"capacity": 1, "refill_per_s": 0}}, "tenants": {"acme": {}}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     admit(5000, req("acme", "k2"), outcome="rejected", reason="tenant_rate", http=429, retry_after_ms=None)])

scenario("tenant-concurrency", "A tenant concurrency limit refuses with 429 and the policy's busy estimate; another tenant is unaffected; release on completion frees it.",
    {"tenant_defaults": {"concurrency": None}, "tenants": {"acme": {"concurrency": 1}, "globex": {}},
     "policy_params": {"busy_retry_after_ms": 750}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     admit(0, req("acme", "k2"), outcome="rejected", reason="tenant_concurrency", http=429, retry_after_ms=750),
     admit(0, req("globex", "k1"), outcome="accepted"),
     inspect(0, slots={"global": 2, "tenant.acme": 1}, buckets={"tenant.acme.requests": 9, "tenant.acme.tokens": 19800}),
     complete(1, "acme", "k1", "succeeded", {"ok": True}),
     admit(1, req("acme", "k2"), outcome="accepted"),
     inspect(1, slots={"global": 2, "tenant.acme": 1})])

scenario("token-refund-bounds", "A refund never exceeds capacity and is ignored when refunds are off (the default).",
    {"tenant_defaults": {"tokens": {"capacity": 1000, "refill_per_s": 0}}, "tenants": {"acme": {}}},
    [admit(0, req("acme", "k1", i=100, o=400), outcome="accepted", reserved_tokens=500),
     complete(0, "acme", "k1", "succeeded", {"ok": True}, usage={"input_tokens": 100, "output_tokens": 10}),
     inspect(0, buckets={"tenant.acme.tokens": 500})])

scenario("refund-after-reconcile", "Usage given at reconciliation refunds the unused reservation of an unknown outcome, and the slot is released once.",
    {"refund_unused_tokens": True, "tenant_defaults": {"tokens": {"capacity": 1000, "refill_per_s": 0}},
     "tenants": {"acme": {}}},
    [admit(0, req("acme", "k1", i=100, o=400), outcome="accepted", reserved_tokens=500),
     complete(1, "acme", "k1", "unknown", {"ok": True, "retry": {"eligible": False, "reason": "unknown_outcome"}}),
     inspect(1, slots={"global": 1}, buckets={"tenant.acme.tokens": 500}),
     reconcile(2, "acme", "k1", "succeeded", {"ok": True}, usage={"input_tokens": 100, "output_tokens": 100}),
     inspect(2, slots={"global": 0}, buckets={"tenant.acme.tokens": 800}),
     reconcile(3, "acme", "k1", "succeeded", {"ok": False, "error": "not_unknown"}),
     inspect(3, slots={"global": 0}, buckets={"tenant.acme.tokens": 800})])

# --- operations -----------------------------------------------------------------------
scenario("fingerprints", "A caller's fingerprint decides sameness; deadlines are not part of it; conflicts spend nothing.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "k1", fingerprint="f1"), outcome="accepted"),
     admit(1, req("acme", "k1", o=999, fingerprint="f1"), outcome="duplicate_active", http=409),
     admit(1, req("acme", "k1", fingerprint="f2"), outcome="conflict", http=422),
     admit(2, req("acme", "k2"), outcome="accepted"),
     admit(2, req("acme", "k2", deadline=99999), outcome="duplicate_active"),
     admit(2, req("acme", "k2", body_ref="other"), outcome="conflict"),
     inspect(2, buckets={"tenant.acme.requests": 8}, slots={"global": 2})])

scenario("reconcile-failed-is-final", "Reconciling an unknown outcome as failed makes it failed_final: never retried, replayed as completed.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     complete(1, "acme", "k1", "unknown", {"ok": True}),
     complete(2, "acme", "k1", "unknown", {"ok": True, "retry": {"eligible": False, "reason": "unknown_outcome"}}),
     complete(2, "acme", "k1", "succeeded", {"ok": False, "error": "not_active"}),
     reconcile(3, "acme", "k1", "failed", {"ok": True}),
     admit(4, req("acme", "k1"), outcome="duplicate_completed", http=200, state="failed_final"),
     inspect(4, slots={"global": 0}, operations=[{"tenant": "acme", "key": "k1", "state": "failed_final", "attempt": 1}]),
     reconcile(5, "acme", "nope", "failed", {"ok": False, "error": "unknown_operation"}),
     reconcile(5, "acme", "k1", "failed", {"ok": False, "error": "not_unknown"})])

scenario("tenant-scoping", "Keys are scoped per tenant: another tenant's saved answer is never replayed, and it cannot complete another tenant's operation.",
    {"tenants": {"acme": {}, "globex": {}}},
    [admit(0, req("acme", "shared"), outcome="accepted"),
     complete(1, "acme", "shared", "succeeded", {"ok": True}, result_ref="secret/acme"),
     admit(2, req("globex", "shared"), outcome="accepted", result_ref=None),
     complete(3, "globex", "other", "succeeded", {"ok": False, "error": "unknown_operation"}),
     admit(4, req("acme", "shared"), outcome="duplicate_completed", result_ref="secret/acme"),
     inspect(4, operations=[{"tenant": "globex", "key": "shared", "state": "active"}])])

scenario("retry-keeps-its-deadline", "A retry runs under the deadline stored at first admission, whatever the new request says.",
    {"tenants": {"acme": {}}, "policy_params": {"exec_base_ms": 100, "backoff_base_ms": 0, "backoff_cap_ms": 0}},
    [admit(0, req("acme", "k1", deadline=1000), outcome="accepted", attempt=1),
     admit(0, req("acme", "k2", deadline=1000), outcome="accepted", attempt=1),
     complete(10, "acme", "k1", "failed", {"ok": True, "retry": {"eligible": True, "not_before_ms": 10}}, failure="unavailable"),
     complete(10, "acme", "k2", "failed", {"ok": True, "retry": {"eligible": True, "not_before_ms": 10}}, failure="unavailable"),
     admit(800, req("acme", "k2", deadline=5), outcome="accepted", attempt=2),
     admit(950, req("acme", "k1", deadline=999999), outcome="rejected", reason="deadline_exceeded", http=504),
     inspect(950, operations=[{"tenant": "acme", "key": "k1", "state": "retry_pending", "attempt": 1}])])

scenario("retry-pending-conflict", "A retry with another payload is a conflict; an unknown failure kind is not retried.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     complete(1, "acme", "k1", "failed", {"ok": True, "retry": {"eligible": True}}, failure="connect_failed"),
     admit(5000, req("acme", "k1", i=1), outcome="conflict", http=422),
     admit(5000, req("acme", "k2"), outcome="accepted"),
     complete(5001, "acme", "k2", "failed", {"ok": True, "retry": {"eligible": False, "reason": "not_retryable"}}, failure="gremlins"),
     admit(5002, req("acme", "k3"), outcome="accepted"),
     complete(5003, "acme", "k3", "failed", {"ok": True, "retry": {"eligible": False, "reason": "not_retryable"}})])

scenario("degraded-answer-is-saved", "A degraded acceptance is replayed as degraded; the reduction is never applied to durable work.",
    {"global": {"concurrency": 2}, "tenants": {"acme": {}},
     "policy_params": {"degrade_at_slot_fraction": 0.0, "degraded_max_output_tokens": 10}},
    [admit(0, req("acme", "k1", o=100, optional_context_tokens=50), outcome="accepted", degraded=True, max_output_tokens=10, optional_context_tokens=0, reserved_tokens=110),
     admit(1, req("acme", "k1", o=100, optional_context_tokens=50), outcome="duplicate_active", degraded=True, max_output_tokens=10),
     complete(2, "acme", "k1", "succeeded", {"ok": True}),
     admit(3, req("acme", "k1", o=100, optional_context_tokens=50), outcome="duplicate_completed", degraded=True, reserved_tokens=110),
     admit(3, req("acme", "k2", o=5), outcome="accepted", degraded=False, max_output_tokens=5),
     admit(3, req("acme", "d1", route="durable", o=100, optional_context_tokens=50), outcome="queued", degraded=False, reserved_tokens=250)])

scenario("degradation-cannot-save-it", "When even the reduced request cannot fit the token bucket the answer is a refusal with the wait for the full request; a request too large even reduced is too_large.",
    {"tenant_defaults": {"tokens": {"capacity": 1000, "refill_per_s": 100}}, "tenants": {"acme": {}},
     "policy_params": {"degrade_on_token_shortage": True, "degraded_max_output_tokens": 100}},
    [admit(0, req("acme", "k1", i=900, o=50), outcome="accepted", reserved_tokens=950),
     admit(0, req("acme", "k2", i=100, o=400), outcome="rejected", reason="token_budget", http=429, retry_after_ms=4500),
     admit(0, req("acme", "k3", i=1001, o=1), outcome="rejected", reason="too_large", http=413, retry_after_ms=None),
     admit(0, req("acme", "k4", i=500, o=2000), outcome="rejected", reason="token_budget", retry_after_ms=5500),
     admit(6000, req("acme", "k4", i=500, o=2000), outcome="accepted", degraded=True, reserved_tokens=600),
     inspect(6000, buckets={"tenant.acme.tokens": 50})])

# --- policies ---------------------------------------------------------------------------
scenario("deny-all-refuses-everything", "deny-all refuses interactive and durable admissions alike, spending nothing.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "k1"), outcome="rejected", reason="overloaded", http=503),
     admit(0, req("acme", "d1", route="durable"), outcome="rejected", reason="overloaded", http=503),
     inspect(0, buckets={"tenant.acme.requests": 10, "global.requests": 100}, queues={"acme": 0}, slots={"global": 0})],
    policy="deny-all")

scenario("swap-refusals-name-the-problem", "A module that does not fit the world is refused with a message naming what is missing, and the active policy stays.",
    {"tenants": {"acme": {}}},
    [{"at_ms": 0, "op": "swap_policy", "policy": "broken", "expect": {"ok": False, "error_contains": "tollgate:policy/decide"}},
     {"at_ms": 0, "op": "swap_policy", "policy": "no-such-policy", "expect": {"ok": False, "error_contains": "unknown policy"}},
     admit(1, req("acme", "k1"), outcome="accepted"),
     {"at_ms": 2, "op": "swap_policy", "policy": "faulty", "expect": {"ok": True}},
     admit(3, req("acme", "trap-2"), outcome="rejected", reason="policy_error"),
     complete(4, "acme", "k1", "succeeded", {"ok": True}),
     inspect(4, slots={"global": 0})])

scenario("faulty-retry-fails-closed", "Faults spend nothing even for durable work, and a faulting policy leaves the store as it was.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "spin-d", route="durable"), outcome="rejected", reason="policy_error", http=503, retry_after_ms=None),
     admit(0, req("acme", "hog-d", route="durable"), outcome="rejected", reason="policy_error"),
     inspect(0, queues={"acme": 0}, buckets={"tenant.acme.requests": 10}),
     admit(0, req("acme", "trap-1"), outcome="rejected", reason="policy_error"),
     admit(1, req("acme", "fine"), outcome="accepted")],
    policy="faulty")

scenario("contract-breaking-plans-fail-closed", "A policy that asks for more than was requested, for no output, or for an endless execution is refused or bounded by the host; its retry time in the past becomes now.",
    {"tenants": {"acme": {}}, "global": {"concurrency": 1}},
    [admit(0, req("acme", "raise-1"), outcome="rejected", reason="policy_error", http=503, retry_after_ms=None),
     admit(0, req("acme", "context-1", optional_context_tokens=5), outcome="rejected", reason="policy_error"),
     admit(0, req("acme", "zero-1"), outcome="rejected", reason="policy_error"),
     admit(0, req("acme", "forever-1"), outcome="rejected", reason="deadline_exceeded", http=504),
     inspect(0, buckets={"tenant.acme.requests": 10, "tenant.acme.tokens": 20000}, slots={"global": 0}),
     admit(1, req("acme", "k1"), outcome="accepted"),
     admit(1, req("acme", "k2"), outcome="rejected", reason="global_concurrency", http=503, retry_after_ms=3600000),
     complete(5, "acme", "k1", "failed", {"ok": True, "retry": {"eligible": True, "not_before_ms": 5}}, failure="bad_request"),
     admit(5, req("acme", "k1"), outcome="accepted", attempt=2)],
    policy="greedy")

# --- durable and dispatch ---------------------------------------------------------------
scenario("durable-retry-requeues", "A failed durable job eligible for retry goes back to the tail of its queue, waits for not_before without blocking others, and its attempt grows when claimed again.",
    {"tenants": {"acme": {}}, "policy_params": {"backoff_base_ms": 1000, "backoff_cap_ms": 1000},
     "scheduler": {"max_claims_per_worker": 10}},
    [admit(0, req("acme", "j1", route="durable"), outcome="queued", http=202, attempt=1),
     admit(0, req("acme", "j2", route="durable"), outcome="queued"),
     dispatch(1, "w1", 1, claimed=jobs(("acme", "j1"))),
     complete(2, "acme", "j1", "failed", {"ok": True, "retry": {"eligible": True}}, failure="rate_limited", provider_retry_after_ms=5000),
     admit(3, req("acme", "j1", route="durable"), outcome="duplicate_active", http=409),
     inspect(3, queues={"acme": 2}, operations=[{"tenant": "acme", "key": "j1", "state": "queued", "attempt": 1}], slots={"global": 0}),
     dispatch(4, "w1", 5, claimed=jobs(("acme", "j2")), reason="empty"),
     dispatch(5002, "w1", 5, claimed=jobs(("acme", "j1"))),
     inspect(5002, operations=[{"tenant": "acme", "key": "j1", "state": "active", "attempt": 2}]),
     complete(5003, "acme", "j1", "succeeded", {"ok": True}),
     admit(5004, req("acme", "j1", route="durable"), outcome="duplicate_completed", state="succeeded")])

scenario("dispatch-no-capacity", "A job whose tokens or slot cannot be reserved stays queued and the call says no_capacity; another tenant's job is still claimed.",
    {"global": {"concurrency": 10},
     "tenant_defaults": {"tokens": {"capacity": 1000, "refill_per_s": 0}},
     "tenants": {"a": {}, "b": {}}},
    [admit(0, req("a", "big", i=500, o=400), outcome="accepted"),
     admit(0, req("a", "d1", route="durable", i=100, o=100), outcome="queued"),
     admit(0, req("b", "d1", route="durable", i=100, o=100), outcome="queued"),
     dispatch(1, "w1", 5, claimed=jobs(("b", "d1")), reason="no_capacity"),
     inspect(1, queues={"a": 1, "b": 0}, buckets={"tenant.a.tokens": 100, "tenant.b.tokens": 800}),
     dispatch(2, "w1", 5, claimed_count=0, reason="no_capacity")])

scenario("dispatch-stops-when-nothing-can-be-claimed", "A turn that ends on an emptied queue, followed by tenants that cannot reserve, ends the call with no_capacity instead of cycling.",
    {"global": {"concurrency": 100}, "scheduler": {"max_claims_per_worker": 100},
     "tenant_defaults": {"tokens": {"capacity": 1000, "refill_per_s": 0}},
     "tenants": {"a": {"weight": 2}, "b": {}, "c": {}}},
    [admit(0, req("a", "a1", route="durable"), outcome="queued"),
     admit(0, req("b", "big", i=450, o=450), outcome="accepted"),
     admit(0, req("c", "big", i=450, o=450), outcome="accepted"),
     admit(0, req("b", "b1", route="durable", i=100, o=100), outcome="queued"),
     admit(0, req("c", "c1", route="durable", i=100, o=100), outcome="queued"),
     dispatch(1, "w", 1, claimed=jobs(("a", "a1"))),
     dispatch(2, "w", 5, claimed_count=0, reason="no_capacity"),
     complete(3, "b", "big", "succeeded", {"ok": True}),
     dispatch(4, "w", 5, claimed_count=0, reason="no_capacity"),
     inspect(4, queues={"a": 0, "b": 1, "c": 1})])

scenario("queue-full", "The queue bound counts per tenant, answers 429 with the busy estimate, and spends nothing.",
    {"tenant_defaults": {"queue_limit": 1}, "tenants": {"a": {}, "b": {}}, "policy_params": {"busy_retry_after_ms": 300}},
    [admit(0, req("a", "d1", route="durable"), outcome="queued"),
     admit(0, req("a", "d2", route="durable"), outcome="rejected", reason="queue_full", http=429, retry_after_ms=300),
     admit(0, req("b", "d1", route="durable"), outcome="queued"),
     inspect(0, queues={"a": 1, "b": 1}, buckets={"tenant.a.requests": 9}),
     admit(0, req("a", "big", route="durable", i=20001, o=1), outcome="rejected", reason="too_large", http=413)])

scenario("wrr-position-persists", "The round-robin position persists across calls: one claim at a time gives the same order as a long call.",
    {"global": {"concurrency": 100}, "scheduler": {"max_claims_per_worker": 100},
     "tenants": {"a": {"weight": 2}, "b": {}, "c": {}}},
    [admit(0, req(t, f"{t}{n}", route="durable")) for n in range(4) for t in "abc"] +
    [dispatch(1, "w", 1, claimed=jobs(("a", "a0"))),
     dispatch(1, "w", 1, claimed=jobs(("a", "a1"))),
     dispatch(1, "w", 1, claimed=jobs(("b", "b0"))),
     dispatch(1, "w", 1, claimed=jobs(("c", "c0"))),
     dispatch(1, "w", 3, claimed=jobs(("a", "a2"), ("a", "a3"), ("b", "b1"))),
     dispatch(1, "w", 10, claimed=jobs(("c", "c1"), ("b", "b2"), ("c", "c2"), ("b", "b3"), ("c", "c3")), reason="empty")])

scenario("drr-large-jobs", "Jobs larger than the quantum are claimed after enough turns; a small-job tenant is not starved and not favoured.",
    {"global": {"concurrency": 100},
     "tenant_defaults": {"tokens": {"capacity": 100000, "refill_per_s": 0}, "queue_limit": 20},
     "scheduler": {"discipline": "drr_tokens", "quantum_tokens": 100, "max_claims_per_worker": 100},
     "tenants": {"a": {}, "b": {}}},
    [admit(0, req("a", f"a{n}", route="durable", i=250, o=250), outcome="queued") for n in range(3)] +
    [admit(0, req("b", f"b{n}", route="durable", i=50, o=50), outcome="queued") for n in range(10)] +
    [dispatch(1, "w", 6, claimed=jobs(("b", "b0"), ("b", "b1"), ("b", "b2"), ("b", "b3"), ("a", "a0"), ("b", "b4"))),
     dispatch(1, "w", 100, claimed_by_tenant={"a": 2, "b": 5}, reason="empty")])

scenario("expiry-reports-every-tenant", "Dispatch expires infeasible jobs of every tenant before anything else, even when it claims nothing, and expired keys replay as completed.",
    {"tenants": {"a": {}, "b": {}}, "policy_params": {"exec_base_ms": 1000}},
    [admit(0, req("a", "soon", route="durable", deadline=1500), outcome="queued"),
     admit(0, req("b", "soon", route="durable", deadline=1200), outcome="queued"),
     admit(0, req("b", "later", route="durable", deadline=90000), outcome="queued"),
     {"at_ms": 600, "op": "set_downstream", "available": False},
     dispatch(600, "w", 5, claimed_count=0, expired=jobs(("a", "soon"), ("b", "soon")), reason="downstream_unavailable"),
     inspect(600, queues={"a": 0, "b": 1}, operations=[{"tenant": "a", "key": "soon", "state": "expired"}]),
     admit(601, req("a", "soon", route="durable", deadline=1500), outcome="duplicate_completed", state="expired")])

scenario("downstream-retry-after", "Interactive refusals while the downstream is down carry the busy estimate; complete still works.",
    {"tenants": {"acme": {}}, "policy_params": {"busy_retry_after_ms": 2500}},
    [admit(0, req("acme", "k1"), outcome="accepted"),
     {"at_ms": 1, "op": "set_downstream", "available": False},
     admit(2, req("acme", "k2"), outcome="rejected", reason="downstream_unavailable", http=503, retry_after_ms=2500),
     admit(2, req("acme", "k1"), outcome="duplicate_active"),
     complete(3, "acme", "k1", "succeeded", {"ok": True}),
     inspect(3, slots={"global": 0}, buckets={"tenant.acme.requests": 9})])

scenario("validation-more", "Types are strict and unknown request fields are refused; an unknown tenant is refused before anything else.",
    {"tenants": {"acme": {}}},
    [admit(0, req("acme", "k1", fingerprint=5), outcome="rejected", reason="invalid_request", http=400),
     admit(0, req("acme", "k1", colour="blue"), outcome="rejected", reason="invalid_request"),
     admit(0, req("acme", "k1", optional_context_tokens=-1), outcome="rejected", reason="invalid_request"),
     admit(0, req("acme", "k1", size_bytes="10"), outcome="rejected", reason="invalid_request"),
     admit(0, req("acme", "k1", deadline="soon"), outcome="rejected", reason="invalid_request"),
     admit(0, req("nobody", "", i=0), outcome="rejected", reason="unknown_tenant", http=401),
     admit(0, {"key": "k1", "route": "interactive", "input_tokens": 1, "max_output_tokens": 1, "deadline_ms": 9}, outcome="rejected", reason="invalid_request"),
     admit(0, req("acme", "k1", route="durable", size_bytes=65537), outcome="rejected", reason="too_large", http=413),
     inspect(0, buckets={"tenant.acme.requests": 10}, queues={"acme": 0})])

os.makedirs(HERE, exist_ok=True)
for name, s in SCENARIOS.items():
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
print(f"wrote {len(SCENARIOS)} scenarios")
