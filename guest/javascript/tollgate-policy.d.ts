// Types of the tollgate policy SDK for JavaScript and of the world `tollgate:policy@0.3.0`
// as componentize-js presents it: records are objects with camelCase fields, enums are
// kebab-case strings, variants are `{ tag, val }`, an absent option is `undefined`, and
// u64/s64 are BigInt (u32 and f64 are numbers).

export type Route = "interactive" | "durable";
export type Priority = "critical" | "standard" | "sheddable";

/** One admission request, as validated by the host, before any degradation. */
export interface Request {
  tenant: string;
  key: string;
  route: Route;
  inputTokens: bigint;
  optionalContextTokens: bigint;
  maxOutputTokens: bigint;
  /** Absolute deadline in logical milliseconds. */
  deadlineMs: bigint;
  sizeBytes: bigint;
  /** The attempt this admission would start (1 for a new operation). */
  attempt: number;
  model: string | undefined;
  priority: Priority;
  labels: Array<[string, string]>;
}

/** What the policy wants reserved; it may only reduce the requested fields. */
export interface Plan {
  maxOutputTokens: bigint;
  optionalContextTokens: bigint;
  estimatedExecMs: bigint;
  busyRetryAfterMs: bigint | undefined;
}

export type RefusalReason =
  | "overloaded"
  | "too-large"
  | "deadline-exceeded"
  | "token-budget"
  | "tenant-rate"
  | "global-rate"
  | "tenant-concurrency"
  | "global-concurrency"
  | "queue-full"
  | "downstream-unavailable"
  | "model-rate"
  | "model-token-budget"
  | "cost-budget";

export interface Refusal {
  reason: RefusalReason;
  retryAfterMs: bigint | undefined;
}

export type Admission = { tag: "admit"; val: Plan } | { tag: "refuse"; val: Refusal };

export type Failure =
  | { tag: "rate-limited" }
  | { tag: "unavailable" }
  | { tag: "connect-failed" }
  | { tag: "bad-request" }
  | { tag: "auth-failed" }
  | { tag: "content-filtered" }
  | { tag: "other"; val: string };

/** A `failed` completion of one attempt. */
export interface FailureReport {
  tenant: string;
  key: string;
  route: Route;
  attempt: number;
  failure: Failure | undefined;
  providerRetryAfterMs: bigint | undefined;
  deadlineMs: bigint;
  maxOutputTokens: bigint;
  optionalContextTokens: bigint;
  inputTokens: bigint;
  model: string | undefined;
  priority: Priority;
}

export type GiveUpReason =
  | "unknown-outcome"
  | "not-retryable"
  | "attempts-exhausted"
  | "deadline-exceeded";

export type RetryDecision = { tag: "retry"; val: bigint } | { tag: "give-up"; val: GiveUpReason };

export type BucketKind =
  | "global-requests"
  | "tenant-requests"
  | "tenant-tokens"
  | "model-requests"
  | "model-tokens"
  | "tenant-model-tokens"
  | "tenant-cost";

export type LogLevel = "debug" | "info" | "warn" | "error";

export interface BucketLevel {
  available: bigint;
  capacity: bigint;
  refillPerS: number;
}

export type SlotScope = "global" | "tenant";

export interface SlotLevel {
  inUse: number;
  limit: number;
}

export interface PolicyInfo {
  name: string;
  version: string;
}

/** What the host lends a policy during one decision (scoped to its tenant, read-only). */
export interface Host {
  nowMs(): bigint;
  param(name: string): number | undefined;
  paramString(name: string): string | undefined;
  log(level: LogLevel, message: string): void;
  tenantWeight(): number;
  bucket(kind: BucketKind): BucketLevel | undefined;
  slots(scope: SlotScope): SlotLevel | undefined;
  random(upper: bigint): bigint;
  /** Words for the caller about this decision's refusal or degradation (at most 256 bytes
   * kept; the last call wins). */
  explain(message: string): void;
}

export const host: Host;

/** The `decide` export of a policy. */
export interface Decide {
  describe(): PolicyInfo;
  selfCheck(): void;
  admit(req: Request): Admission;
  onFailure(report: FailureReport): RetryDecision;
}

/** The parameters the standard rules read, with the contract's defaults; each is asked of
 * the host the first time it is read in a decision. */
export interface Params {
  readonly maxAttempts: number;
  readonly backoffBaseMs: number;
  readonly backoffCapMs: number;
  readonly execBaseMs: number;
  readonly execMsPerOutputToken: number;
  readonly degradeAtSlotFraction: number;
  readonly degradeOnTokenShortage: boolean;
  readonly degradedMaxOutputTokens: number;
  readonly busyRetryAfterMs: number;
  readonly shedSheddableAtSlotFraction: number;
  /** Any numeric parameter `name`, asked of the host once per decision. */
  read(name: string, fallback: number): number;
}

export function toU64(x: number): bigint;
export function paramOr(name: string, fallback: number): number;
export function reservation(input: bigint, optionalContext: bigint, maxOutput: bigint): bigint;
export function admit(plan: Plan): Admission;
export function refuse(reason: RefusalReason, retryAfterMs?: bigint): Admission;
export function retry(notBeforeMs: bigint): RetryDecision;
export function giveUp(reason: GiveUpReason): RetryDecision;
export function readParams(): Params;
export function estimatedExecMs(p: Params, maxOutputTokens: bigint): bigint;
export function slotsReach(fraction: number): boolean;
/** The plan that admits `req` as asked, with the standard estimate; then `degrade` it. */
export function plan(req: Request): Plan;
/** `plan` capped at `maxOutputTokens` of output (at least 1, never raised), optional
 * context dropped, execution estimate recomputed. */
export function degrade(plan: Plan, maxOutputTokens: bigint | number): Plan;
export function backoffDelayMs(report: FailureReport, p: Params): bigint;

/** The standard rules of the contract. */
export const standard: {
  /** `undefined` when the parameters make sense, else what is wrong. */
  check(): string | undefined;
  admit(req: Request): Admission;
  onFailure(report: FailureReport): RetryDecision;
};

/** A policy's `decide` export; what is left out is the standard rules. */
export function policy(spec: {
  name: string;
  version?: string;
  check?: () => string | undefined;
  admit?: (req: Request) => Admission;
  onFailure?: (report: FailureReport) => RetryDecision;
}): Decide;
