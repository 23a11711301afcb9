//! `tollgate decide`, `queue`, `ops` and `spend`: one decision from standard input, and what
//! a store holds.

use super::{open_engine, wall_clock_ms, EngineArgs};
use std::io::{Read, Write};
use std::process::ExitCode;
use tollgate::engine::Decision;
use tollgate::reason::Reason;

#[derive(clap::Args)]
pub struct DecideArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Logical time of the decision, in ms (default: the wall clock).
    #[arg(long)]
    now: Option<i64>,
    /// Read one request per line and print one decision per line, until end of input.
    #[arg(long)]
    lines: bool,
}

pub fn decide(args: DecideArgs) -> Result<ExitCode, String> {
    let engine = open_engine(&args.engine)?;
    let now = || args.now.unwrap_or_else(wall_clock_ms);
    if args.lines {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        for line in std::io::stdin().lines() {
            let line = line.map_err(|e| e.to_string())?;
            let decision = match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(request) => engine.admit(&request, now()).map_err(|e| e.to_string())?,
                Err(_) => Decision::rejected(Reason::InvalidRequest, None),
            };
            writeln!(out, "{}", serde_json::to_string(&decision).unwrap())
                .map_err(|e| e.to_string())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| e.to_string())?;
    let request: serde_json::Value =
        serde_json::from_str(&input).map_err(|e| format!("request is not JSON: {e}"))?;
    let decision = engine.admit(&request, now()).map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&decision).unwrap());
    Ok(ExitCode::SUCCESS)
}

pub fn queue(args: &EngineArgs) -> Result<ExitCode, String> {
    let engine = open_engine(args)?;
    for (tenant, depth) in engine.queue_depths().map_err(|e| e.to_string())? {
        println!("{tenant}\t{depth}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn ops(args: &EngineArgs) -> Result<ExitCode, String> {
    let engine = open_engine(args)?;
    let inspection = engine.inspect(wall_clock_ms()).map_err(|e| e.to_string())?;
    println!("tenant\tkey\tstate\tattempt\treserved\tused_in\tused_out\tpolicy");
    for op in inspection.operations {
        let (used_in, used_out) = op.usage.map_or(("-".into(), "-".into()), |u| {
            (u.input_tokens.to_string(), u.output_tokens.to_string())
        });
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            op.tenant,
            op.key,
            op.state.as_str(),
            op.attempt,
            op.reserved_tokens,
            used_in,
            used_out,
            op.policy
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct SpendArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// What to sum by: tenant, group, model or day.
    #[arg(long, default_value = "tenant")]
    group_by: String,
    /// The first hour counted: an RFC 3339 time, a YYYY-MM-DD day or epoch ms (default:
    /// the start of this UTC month).
    #[arg(long)]
    from: Option<String>,
    /// The end, exclusive, in the same forms (default: now).
    #[arg(long)]
    to: Option<String>,
    /// Print CSV with a header row instead of JSON.
    #[arg(long)]
    csv: bool,
}

/// `tollgate spend`: the store's spend ledger summed as `GET /v1/admin/spend` sums it.
pub fn spend(args: SpendArgs) -> Result<ExitCode, String> {
    let query = tollgate::spend::SpendQuery::parse(
        Some(&args.group_by),
        args.from.as_deref(),
        args.to.as_deref(),
        wall_clock_ms(),
    )?;
    let engine = open_engine(&args.engine)?;
    let rows = engine
        .spend(query.from_ms, query.to_ms)
        .map_err(|e| e.to_string())?;
    let lines = tollgate::spend::report(&rows, query.group_by);
    if args.csv {
        print!("{}", tollgate::spend::csv(&lines, query.group_by));
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&query.json(&lines)).unwrap()
        );
    }
    Ok(ExitCode::SUCCESS)
}
