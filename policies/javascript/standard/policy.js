// The standard rules in JavaScript: the same decisions as the Rust `standard` policy,
// through the JavaScript SDK (guest/javascript). Built by
// `tollgate policy build policies/javascript/standard`.
import { policy } from "./sdk/tollgate-policy.js";

export const decide = policy({ name: "standard", version: "0.2.0-javascript" });
