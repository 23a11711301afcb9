// The SDK for writing tollgate policies in JavaScript (types in tollgate-policy.d.ts).
//
// A policy is a WebAssembly component of the `tollgate:policy/policy@0.3.0` world, built by
// `tollgate policy build` with jco (componentize-js). It decides; the host reserves. A
// policy module exports `decide`, made with `policy({...})`: every method it leaves out is
// the standard rules, so a policy writes only what it changes.
//
// The world's values as componentize-js gives them: records are objects with camelCase
// fields, enums are kebab-case strings, variants are `{ tag, val }`, an absent option is
// `undefined`, and u64/s64 are BigInt (u32 and f64 are numbers).

import * as host from "tollgate:policy/host@0.3.0";

export { host };

const U64_MAX = (1n << 64n) - 1n;
const I64_MAX = (1n << 63n) - 1n;
const I64_MIN = -(1n << 63n);

/** Saturating conversion of a non-negative float to whole units (BigInt). */
export function toU64(x) {
  if (Number.isNaN(x) || x <= 0) return 0n;
  if (x >= 18446744073709551615) return U64_MAX;
  return BigInt(Math.trunc(x));
}

const clamp = (x, lo, hi) => (x < lo ? lo : x > hi ? hi : x);
const satU64 = (x) => clamp(x, 0n, U64_MAX);
const satI64 = (x) => clamp(x, I64_MIN, I64_MAX);
/** A u64 as Rust's `as i64` reads it (wrapping). */
const asI64 = (x) => (x > I64_MAX ? x - (1n << 64n) : x);

/** `ceil` as the Rust SDK computes it (through i64, saturating; NaN as 0). */
function ceil(x) {
  let t;
  if (Number.isNaN(x)) t = 0;
  else if (x >= 9223372036854775807) t = 9223372036854775807;
  else if (x <= -9223372036854775808) t = -9223372036854775808;
  else t = Math.trunc(x);
  return x > t ? t + 1 : t;
}

/** A policy parameter as a number, or `fallback` when the configuration does not set it. */
export function paramOr(name, fallback) {
  const value = host.param(name);
  return value === undefined ? fallback : value;
}

/** The tokens a request reserves: input, optional context and the output cap. */
export function reservation(input, optionalContext, maxOutput) {
  return satU64(input + optionalContext + maxOutput);
}

/** An admission with this plan. */
export const admit = (plan) => ({ tag: "admit", val: plan });
/** A refusal for `reason`, with the policy's estimate of when waiting cures it. */
export const refuse = (reason, retryAfterMs) => ({
  tag: "refuse",
  val: { reason, retryAfterMs },
});
/** Retry no earlier than this logical time (ms, BigInt). */
export const retry = (notBeforeMs) => ({ tag: "retry", val: notBeforeMs });
/** No retry, for `reason`. */
export const giveUp = (reason) => ({ tag: "give-up", val: reason });

/** The parameters the standard rules read: field, name under `policy_params`, default. */
const PARAMS = [
  ["maxAttempts", "max_attempts", 3],
  ["backoffBaseMs", "backoff_base_ms", 100],
  ["backoffCapMs", "backoff_cap_ms", 2000],
  ["execBaseMs", "exec_base_ms", 0],
  ["execMsPerOutputToken", "exec_ms_per_output_token", 0],
  ["degradeAtSlotFraction", "degrade_at_slot_fraction", 1],
  ["degradeOnTokenShortage", "degrade_on_token_shortage", 0],
  ["degradedMaxOutputTokens", "degraded_max_output_tokens", 256],
  ["busyRetryAfterMs", "busy_retry_after_ms", 1000],
  ["shedSheddableAtSlotFraction", "shed_sheddable_at_slot_fraction", 1],
];

/** The parameters of one decision, each read through `host.param` the first time a rule
 * needs it: a host call costs more than the rule that uses its answer, and most decisions
 * need only a few. */
class Params {
  #read = new Map();

  /** The parameter `name`, asked of the host once per decision. */
  read(name, fallback) {
    let value = this.#read.get(name);
    if (value === undefined) {
      value = paramOr(name, fallback);
      this.#read.set(name, value);
    }
    return value;
  }
}
for (const [field, name, fallback] of PARAMS) {
  const convert = field === "degradeOnTokenShortage" ? (v) => v !== 0 : (v) => v;
  Object.defineProperty(Params.prototype, field, {
    get() {
      return convert(this.read(name, fallback));
    },
  });
}

/** The parameters of one decision (read lazily), with the contract's defaults. */
export function readParams() {
  return new Params();
}

/** `exec_base_ms + max_output_tokens * exec_ms_per_output_token`, rounded up. */
export function estimatedExecMs(p, maxOutputTokens) {
  return toU64(ceil(p.execBaseMs + Number(maxOutputTokens) * p.execMsPerOutputToken));
}

const CHECKED = PARAMS.filter(([field]) => field !== "degradeOnTokenShortage");

/** The standard rules of the contract, exactly as the Rust SDK's `standard` module. */
export const standard = {
  /** `undefined` when the parameters make sense, else what is wrong. */
  check() {
    const p = readParams();
    for (const [field, name] of CHECKED) {
      const value = p[field];
      if (!Number.isFinite(value) || value < 0) {
        return `policy_params.${name} must be a finite number >= 0`;
      }
    }
    if (p.maxAttempts < 1) return "policy_params.max_attempts must be at least 1";
    if (p.degradedMaxOutputTokens < 1) {
      return "policy_params.degraded_max_output_tokens must be at least 1";
    }
    return undefined;
  },

  /** Shed `sheddable` interactive work when global slots in use reach
   * `shed_sheddable_at_slot_fraction` (below 1), degrade other interactive requests (never
   * `critical` ones) under slot pressure or (when enabled) token shortage, and estimate the
   * execution time of what is planned. */
  admit(req) {
    const p = readParams();
    const interactive = req.route === "interactive";
    if (
      interactive &&
      req.priority === "sheddable" &&
      p.shedSheddableAtSlotFraction < 1 &&
      slotsReach(p.shedSheddableAtSlotFraction)
    ) {
      return refuse("overloaded", toU64(p.busyRetryAfterMs));
    }
    const degrade =
      interactive &&
      req.priority !== "critical" &&
      (slotsReach(p.degradeAtSlotFraction) ||
        (p.degradeOnTokenShortage && tokenShortageCured(req, reduce(req, p))));
    const [output, context] = degrade
      ? reduce(req, p)
      : [req.maxOutputTokens, req.optionalContextTokens];
    return admit({
      maxOutputTokens: output,
      optionalContextTokens: context,
      estimatedExecMs: estimatedExecMs(p, output),
      busyRetryAfterMs: toU64(p.busyRetryAfterMs),
    });
  },

  /** Rate-limited, unavailable and connect failures are retried with capped, jittered
   * backoff while attempts and the deadline allow. */
  onFailure(report) {
    const p = readParams();
    const kind = report.failure === undefined ? undefined : report.failure.tag;
    if (!["rate-limited", "unavailable", "connect-failed"].includes(kind)) {
      return giveUp("not-retryable");
    }
    if (report.attempt >= p.maxAttempts) return giveUp("attempts-exhausted");
    const delay = backoffDelayMs(report, p);
    const notBefore = satI64(host.nowMs() + asI64(delay));
    const estimate = estimatedExecMs(p, report.maxOutputTokens);
    if (satI64(notBefore + asI64(estimate)) >= report.deadlineMs) {
      return giveUp("deadline-exceeded");
    }
    return retry(notBefore);
  },
};

/** The plan that admits `req` as asked: its output cap and optional context, with the
 * standard execution estimate and busy retry-after. Start here, then `degrade` it. */
export function plan(req) {
  const p = readParams();
  return {
    maxOutputTokens: req.maxOutputTokens,
    optionalContextTokens: req.optionalContextTokens,
    estimatedExecMs: estimatedExecMs(p, req.maxOutputTokens),
    busyRetryAfterMs: toU64(p.busyRetryAfterMs),
  };
}

/** `plan` reduced to at most `maxOutputTokens` of output (at least 1) with its optional
 * context dropped, as the standard degradation does, and its execution estimate recomputed
 * for the new cap. A plan is never raised: a cap above the plan's own keeps the plan's. To
 * keep the context, set `optionalContextTokens` back on the result. */
export function degrade(plan, maxOutputTokens) {
  let cap = BigInt(maxOutputTokens);
  if (cap < 1n) cap = 1n;
  if (cap > plan.maxOutputTokens) cap = plan.maxOutputTokens;
  return {
    ...plan,
    maxOutputTokens: cap,
    optionalContextTokens: 0n,
    estimatedExecMs: estimatedExecMs(readParams(), cap),
  };
}

/** Global slots in use before this admission reach `fraction` of the limit. */
export function slotsReach(fraction) {
  const level = host.slots("global");
  return level !== undefined && level.inUse >= fraction * level.limit;
}

/** The degraded form of a request: output capped, optional context dropped. */
function reduce(req, p) {
  let cap = toU64(p.degradedMaxOutputTokens);
  if (cap < 1n) cap = 1n;
  return [req.maxOutputTokens < cap ? req.maxOutputTokens : cap, 0n];
}

const TOKEN_BUCKETS = ["tenant-tokens", "model-tokens", "tenant-model-tokens"];

/** The full reservation does not fit some token bucket now, and the reduced one fits every
 * one: either now, or (for a request larger than a bucket can ever hold) once it refills. */
function tokenShortageCured(req, reduced) {
  const full = reservation(req.inputTokens, req.optionalContextTokens, req.maxOutputTokens);
  const small = reservation(req.inputTokens, reduced[1], reduced[0]);
  if (small >= full) return false;
  let short = false;
  for (const kind of TOKEN_BUCKETS) {
    const bucket = host.bucket(kind);
    if (bucket === undefined || full <= bucket.available) continue;
    short = true;
    const cured =
      small <= bucket.available || (full > bucket.capacity && small <= bucket.capacity);
    if (!cured) return false;
  }
  return short;
}

/** Capped exponential backoff with full jitter; a provider's retry-after is a floor. */
export function backoffDelayMs(report, p) {
  const exponent = BigInt(Math.min(Math.max(report.attempt - 1, 0), 62));
  const base = satU64(toU64(p.backoffBaseMs) * (1n << exponent));
  const cap = toU64(p.backoffCapMs);
  const jitter = host.random(base < cap ? base : cap);
  const floor = report.providerRetryAfterMs ?? 0n;
  return jitter > floor ? jitter : floor;
}

/** A policy's `decide` export: `name` and `version`, and any of `check`, `admit` and
 * `onFailure`; what is left out is the standard rules. */
export function policy({ name, version = "0.1.0", check, admit, onFailure }) {
  const checkFn = check ?? standard.check;
  return {
    describe: () => ({ name, version }),
    selfCheck() {
      const problem = checkFn();
      if (problem !== undefined) throw problem;
    },
    admit: admit ?? standard.admit,
    onFailure: onFailure ?? standard.onFailure,
  };
}
