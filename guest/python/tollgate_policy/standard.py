"""The standard rules of the contract (degradation, deadline estimate, retry eligibility),
written against the host imports so that other policies can reuse them. They decide exactly
as the Rust SDK's ``standard`` module does: the same parameters, defaults and arithmetic
(u64 saturating, floats as f64)."""

import math

from wit_world.imports import host
from wit_world.imports.types import (
    Admission_Admit,
    Admission_Refuse,
    BucketKind,
    Failure_ConnectFailed,
    Failure_RateLimited,
    Failure_Unavailable,
    GiveUpReason,
    Plan,
    Priority,
    Refusal,
    RefusalReason,
    RetryDecision_GiveUp,
    RetryDecision_Retry,
    Route,
    SlotScope,
)

U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
I64_MIN = -(1 << 63)


def param_or(name: str, default: float) -> float:
    """A policy parameter as a number, or ``default`` when the configuration does not set it."""
    value = host.param(name)
    return default if value is None else value


def to_u64(x: float) -> int:
    """Saturating conversion of a non-negative float to whole units."""
    if math.isnan(x) or x <= 0.0:
        return 0
    if x >= float(U64_MAX):
        return U64_MAX
    return int(x)


def ceil(x: float) -> float:
    """``ceil`` as the Rust SDK computes it (through i64, saturating; NaN as 0)."""
    if math.isnan(x):
        t = 0.0
    elif x >= float(I64_MAX):
        t = float(I64_MAX)
    elif x <= float(I64_MIN):
        t = float(I64_MIN)
    else:
        t = float(int(x))
    return t + 1.0 if x > t else t


def sat_u64(x: int) -> int:
    return min(max(x, 0), U64_MAX)


def sat_i64(x: int) -> int:
    return min(max(x, I64_MIN), I64_MAX)


def reservation(input_tokens: int, optional_context: int, max_output: int) -> int:
    """The tokens a request reserves: input, optional context and the output cap."""
    return sat_u64(input_tokens + optional_context + max_output)


DEFAULTS = {
    "max_attempts": 3.0,
    "backoff_base_ms": 100.0,
    "backoff_cap_ms": 2000.0,
    "exec_base_ms": 0.0,
    "exec_ms_per_output_token": 0.0,
    "degrade_at_slot_fraction": 1.0,
    "degrade_on_token_shortage": 0.0,
    "degraded_max_output_tokens": 256.0,
    "busy_retry_after_ms": 1000.0,
    "shed_sheddable_at_slot_fraction": 1.0,
}
"""The parameters the standard rules read, with the contract's defaults."""


class Params:
    """The parameters of one decision, each read through ``host.param`` the first time a
    rule needs it (then kept as an attribute): a host call costs more than the rule that
    uses its answer, and most decisions need only a few."""

    def __getattr__(self, name):
        if name not in DEFAULTS:
            raise AttributeError(name)
        value = param_or(name, DEFAULTS[name])
        if name == "degrade_on_token_shortage":
            value = value != 0.0
        setattr(self, name, value)
        return value

    def estimated_exec_ms(self, max_output_tokens: int) -> int:
        """``exec_base_ms + max_output_tokens * exec_ms_per_output_token``, rounded up."""
        ms = self.exec_base_ms + float(max_output_tokens) * self.exec_ms_per_output_token
        return to_u64(ceil(ms))


CHECKED = [name for name in DEFAULTS if name != "degrade_on_token_shortage"]


def self_check():
    """``None`` when the parameters make sense, else what is wrong."""
    p = Params()
    for name in CHECKED:
        value = getattr(p, name)
        if not math.isfinite(value) or value < 0.0:
            return f"policy_params.{name} must be a finite number >= 0"
    if p.max_attempts < 1.0:
        return "policy_params.max_attempts must be at least 1"
    if p.degraded_max_output_tokens < 1.0:
        return "policy_params.degraded_max_output_tokens must be at least 1"
    return None


def slots_reach(fraction: float) -> bool:
    """Global slots in use before this admission reach ``fraction`` of the limit."""
    level = host.slots(SlotScope.GLOBAL)
    return level is not None and float(level.in_use) >= fraction * float(level.limit)


def plan(req) -> Plan:
    """The plan that admits ``req`` as asked: its output cap and optional context, with the
    standard execution estimate and busy retry-after. Start here, then :func:`degrade` it."""
    p = Params()
    return Plan(
        req.max_output_tokens,
        req.optional_context_tokens,
        p.estimated_exec_ms(req.max_output_tokens),
        to_u64(p.busy_retry_after_ms),
    )


def degrade(plan: Plan, max_output_tokens: int) -> Plan:
    """``plan`` reduced to at most ``max_output_tokens`` of output (at least 1) with its
    optional context dropped, as the standard degradation does, and its execution estimate
    recomputed for the new cap. A plan is never raised: a cap above the plan's own keeps the
    plan's. To keep the context, set ``optional_context_tokens`` back on the result."""
    cap = min(max(int(max_output_tokens), 1), plan.max_output_tokens)
    return Plan(cap, 0, Params().estimated_exec_ms(cap), plan.busy_retry_after_ms)


def reduce(req, p: Params):
    """The degraded form of a request: output capped, optional context dropped."""
    cap = max(to_u64(p.degraded_max_output_tokens), 1)
    return (min(req.max_output_tokens, cap), 0)


TOKEN_BUCKETS = [BucketKind.TENANT_TOKENS, BucketKind.MODEL_TOKENS, BucketKind.TENANT_MODEL_TOKENS]


def token_shortage_cured(req, reduced) -> bool:
    """The full reservation does not fit some token bucket now, and the reduced one fits
    every one: either now, or (for a request larger than a bucket can ever hold) once it
    refills."""
    full = reservation(req.input_tokens, req.optional_context_tokens, req.max_output_tokens)
    small = reservation(req.input_tokens, reduced[1], reduced[0])
    if small >= full:
        return False
    short = False
    for kind in TOKEN_BUCKETS:
        bucket = host.bucket(kind)
        if bucket is None or full <= bucket.available:
            continue
        short = True
        cured = small <= bucket.available or (full > bucket.capacity and small <= bucket.capacity)
        if not cured:
            return False
    return short


def admit(req):
    """Shed ``sheddable`` interactive work when global slots in use reach
    ``shed_sheddable_at_slot_fraction`` (below 1), degrade other interactive requests (never
    ``critical`` ones) under slot pressure or (when enabled) token shortage, and estimate the
    execution time of what is planned."""
    p = Params()
    interactive = req.route == Route.INTERACTIVE
    if (
        interactive
        and req.priority == Priority.SHEDDABLE
        and p.shed_sheddable_at_slot_fraction < 1.0
        and slots_reach(p.shed_sheddable_at_slot_fraction)
    ):
        return Admission_Refuse(
            Refusal(RefusalReason.OVERLOADED, to_u64(p.busy_retry_after_ms))
        )
    if (
        interactive
        and req.priority != Priority.CRITICAL
        and (
            slots_reach(p.degrade_at_slot_fraction)
            or (p.degrade_on_token_shortage and token_shortage_cured(req, reduce(req, p)))
        )
    ):
        output, context = reduce(req, p)
    else:
        output, context = req.max_output_tokens, req.optional_context_tokens
    return Admission_Admit(
        Plan(output, context, p.estimated_exec_ms(output), to_u64(p.busy_retry_after_ms))
    )


def backoff_delay_ms(report, p: Params) -> int:
    """Capped exponential backoff with full jitter; a provider's retry-after is a floor."""
    exponent = min(max(report.attempt - 1, 0), 62)
    ceiling = min(sat_u64(to_u64(p.backoff_base_ms) * (1 << exponent)), to_u64(p.backoff_cap_ms))
    jitter = host.random(ceiling)
    floor = report.provider_retry_after_ms or 0
    return max(jitter, floor)


RETRYABLE = (Failure_RateLimited, Failure_Unavailable, Failure_ConnectFailed)


def on_failure(report):
    """The standard retry eligibility: rate-limited, unavailable and connect failures are
    retried with backoff while attempts and the deadline allow."""
    p = Params()
    if not isinstance(report.failure, RETRYABLE):
        return RetryDecision_GiveUp(GiveUpReason.NOT_RETRYABLE)
    if float(report.attempt) >= p.max_attempts:
        return RetryDecision_GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED)
    delay = backoff_delay_ms(report, p)
    # `as i64` of a u64 wraps in Rust; a delay that large is past any deadline anyway.
    delay_i64 = delay if delay <= I64_MAX else delay - (1 << 64)
    not_before = sat_i64(host.now_ms() + delay_i64)
    estimate = p.estimated_exec_ms(report.max_output_tokens)
    estimate_i64 = estimate if estimate <= I64_MAX else estimate - (1 << 64)
    if sat_i64(not_before + estimate_i64) >= report.deadline_ms:
        return RetryDecision_GiveUp(GiveUpReason.DEADLINE_EXCEEDED)
    return RetryDecision_Retry(not_before)
