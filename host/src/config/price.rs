//! A model's price per token, by class, and what a call costs at it: the most it may cost
//! (what a reservation holds from a money budget) and what a reported usage costs.

use serde::{Deserialize, Serialize};

/// Micro-dollars per token, by class: input and output, and optionally the input read from
/// the provider's cache and written to it (each absent: the input price).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per prompt (and optional context) token.
    pub input: f64,
    /// Per output token.
    pub output: f64,
    /// Per input token read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Per input token written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

impl Price {
    /// Micro-dollars a call of this size may cost at most, rounded up: every input token at
    /// the dearest input class, since which are cached is known only after the call.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        let input = self
            .input
            .max(self.cached_input.unwrap_or(0.0))
            .max(self.cache_write.unwrap_or(0.0));
        let cost = input_tokens as f64 * input + output_tokens as f64 * self.output;
        // Prices are checked finite and bounded, token counts below 2^53: no overflow.
        cost.ceil().min(u64::MAX as f64) as u64
    }

    /// Micro-dollars a reported usage costs, each class at its price, rounded up.
    pub fn cost_of(&self, u: &crate::model::Usage) -> u64 {
        let cached = u.cached_input_tokens.min(u.input_tokens);
        let written = u.cache_write_tokens.min(u.input_tokens - cached);
        let plain = u.input_tokens - cached - written;
        let cost = plain as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + written as f64 * self.cache_write.unwrap_or(self.input)
            + u.output_tokens as f64 * self.output;
        cost.ceil().min(u64::MAX as f64) as u64
    }

    /// Every price it names.
    pub fn all(&self) -> impl Iterator<Item = f64> {
        [self.input, self.output]
            .into_iter()
            .chain(self.cached_input)
            .chain(self.cache_write)
    }
}
