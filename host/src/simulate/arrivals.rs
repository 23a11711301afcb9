//! The requests a simulation offers, generated once from the file and its seed so that
//! every variant and policy compared sees the very same arrivals.

use super::file::{Amount, Arrivals, Simulation, MOST_ARRIVALS, MOST_DURATION_MS};
use super::rng::Rng;
use crate::model::{Priority, Route};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One request's arrival.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// When it arrives.
    pub t_ms: i64,
    /// Its tenant, an index into [`Load::tenants`].
    pub tenant: usize,
    /// How it waits.
    pub route: Route,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output limit.
    pub max_output_tokens: u64,
    /// Its absolute deadline.
    pub deadline_ms: i64,
    /// The model it names.
    pub model: Option<Arc<str>>,
    /// Its priority.
    pub priority: Priority,
}

/// Every arrival, in time order, and the tenants they name.
#[derive(Clone, Debug)]
pub struct Load {
    /// Tenant names, in the order of their indices.
    pub tenants: Vec<String>,
    /// The arrivals, sorted by time.
    pub arrivals: Vec<Arrival>,
}

/// One line of a trace file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    t_ms: u64,
    tenant: String,
    #[serde(default = "interactive")]
    route: Route,
    input_tokens: u64,
    max_output_tokens: u64,
    /// After `t_ms`.
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    priority: Priority,
}

fn interactive() -> Route {
    Route::Interactive
}

/// The largest trace file read (about 5,000,000 lines of 200 bytes).
const MOST_TRACE_BYTES: u64 = 1 << 30;

/// A deadline nobody reaches within a simulation.
const NO_DEADLINE_MS: u64 = MOST_DURATION_MS * 2;

impl Load {
    /// Generates the arrivals of `sim` (the trace read and checked line by line).
    pub fn generate(sim: &Simulation) -> Result<Load, String> {
        let mut tenants: Vec<String> = sim.tenants.keys().cloned().collect();
        let mut index: BTreeMap<String, usize> = tenants
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let mut arrivals = Vec::new();
        let end = sim.duration_ms as f64;
        for (i, load) in sim.tenants.values().enumerate() {
            let mut times = Rng::new(sim.seed, 2 * i as u64 + 1);
            let mut sizes = Rng::new(sim.seed, 2 * i as u64 + 2);
            let model: Option<Arc<str>> = load.model.as_deref().map(Arc::from);
            let deadline = load.deadline_ms.unwrap_or(NO_DEADLINE_MS) as i64;
            let (mut t, mut k) = (0.0f64, 0u64);
            loop {
                t = match load.arrivals {
                    Arrivals::Constant { per_s } => {
                        k += 1;
                        (k - 1) as f64 * 1000.0 / per_s
                    }
                    Arrivals::Poisson { per_s } => t + times.exponential(1000.0 / per_s),
                    Arrivals::Bursts {
                        per_s,
                        on_ms,
                        off_ms,
                    } => {
                        let next = t + times.exponential(1000.0 / per_s);
                        let period = (on_ms + off_ms) as f64;
                        let phase = next % period;
                        if phase < on_ms as f64 {
                            next
                        } else {
                            next - phase + period
                        }
                    }
                };
                if t >= end {
                    break;
                }
                if arrivals.len() >= MOST_ARRIVALS {
                    return Err(format!(
                        "over {MOST_ARRIVALS} arrivals: shorten the duration or lower the rates"
                    ));
                }
                let t_ms = t as i64;
                arrivals.push(Arrival {
                    t_ms,
                    tenant: i,
                    route: load.route,
                    input_tokens: draw(&mut sizes, load.input_tokens),
                    max_output_tokens: draw(&mut sizes, load.max_output_tokens),
                    deadline_ms: t_ms + deadline,
                    model: model.clone(),
                    priority: load.priority,
                });
            }
        }
        if let Some(trace) = &sim.trace {
            let size = std::fs::metadata(trace)
                .map_err(|e| format!("trace {}: {e}", trace.display()))?
                .len();
            if size > MOST_TRACE_BYTES {
                return Err(format!(
                    "trace {}: {size} bytes, over {MOST_TRACE_BYTES}",
                    trace.display()
                ));
            }
            let text = std::fs::read_to_string(trace)
                .map_err(|e| format!("trace {}: {e}", trace.display()))?;
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let at = |e: String| format!("trace {} line {}: {e}", trace.display(), n + 1);
                let l: TraceLine = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
                if l.t_ms >= sim.duration_ms {
                    continue;
                }
                if l.tenant.is_empty() || l.tenant.len() > 255 {
                    return Err(at("tenant must be 1 to 255 bytes".into()));
                }
                if l.input_tokens > 10_000_000 || l.max_output_tokens > 10_000_000 {
                    return Err(at("token counts must be at most 10,000,000".into()));
                }
                if arrivals.len() >= MOST_ARRIVALS {
                    return Err(at(format!("over {MOST_ARRIVALS} arrivals")));
                }
                let tenant = *index.entry(l.tenant.clone()).or_insert_with(|| {
                    tenants.push(l.tenant.clone());
                    tenants.len() - 1
                });
                let deadline = l.deadline_ms.unwrap_or(NO_DEADLINE_MS).min(NO_DEADLINE_MS);
                arrivals.push(Arrival {
                    t_ms: l.t_ms as i64,
                    tenant,
                    route: l.route,
                    input_tokens: l.input_tokens,
                    max_output_tokens: l.max_output_tokens,
                    deadline_ms: (l.t_ms + deadline) as i64,
                    model: l.model.as_deref().map(Arc::from),
                    priority: l.priority,
                });
            }
        }
        // Stable: equal times keep tenant order, so runs are reproducible.
        arrivals.sort_by_key(|a| a.t_ms);
        Ok(Load { tenants, arrivals })
    }
}

fn draw(rng: &mut Rng, amount: Amount) -> u64 {
    match amount {
        Amount::Fixed(n) => n,
        Amount::Uniform { min, max } => rng.between(min, max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn sim(arrivals: serde_json::Value) -> Simulation {
        Simulation::from_json(
            Path::new("x.json"),
            json!({
                "duration_ms": 10000, "seed": 3,
                "config": {"tenants": {"a": {}}},
                "tenants": {"a": {"arrivals": arrivals, "input_tokens": {"min": 1, "max": 9},
                                  "max_output_tokens": 10, "deadline_ms": 500}},
                "provider": {"concurrency": 1, "base_ms": 10}
            }),
        )
        .unwrap()
    }

    #[test]
    fn constant_arrivals_are_evenly_spaced() {
        let load = Load::generate(&sim(json!({"kind": "constant", "per_s": 10}))).unwrap();
        assert_eq!(load.arrivals.len(), 100);
        assert_eq!(load.arrivals[0].t_ms, 0);
        assert_eq!(load.arrivals[1].t_ms, 100);
        assert_eq!(load.arrivals[1].deadline_ms, 600);
        assert!(load
            .arrivals
            .iter()
            .all(|a| (1..=9).contains(&a.input_tokens)));
    }

    #[test]
    fn poisson_and_bursts_keep_their_rates_and_repeat_for_a_seed() {
        let s = sim(json!({"kind": "poisson", "per_s": 50}));
        let a = Load::generate(&s).unwrap();
        assert!(
            (400..600).contains(&a.arrivals.len()),
            "{}",
            a.arrivals.len()
        );
        let b = Load::generate(&s).unwrap();
        let times = |l: &Load| l.arrivals.iter().map(|a| a.t_ms).collect::<Vec<_>>();
        assert_eq!(times(&a), times(&b));
        let bursts = Load::generate(&sim(
            json!({"kind": "bursts", "per_s": 100, "on_ms": 1000, "off_ms": 4000}),
        ))
        .unwrap();
        assert!(bursts.arrivals.iter().all(|a| a.t_ms % 5000 < 1000));
        assert!((120..280).contains(&bursts.arrivals.len()));
    }
}
