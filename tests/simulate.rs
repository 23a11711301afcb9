//! `tollgate simulate`: the shipped examples show what their docs say they show, runs on
//! the same file are the same, and the command writes its summary, plots and report.

use std::path::{Path, PathBuf};
use std::process::Command;
use tollgate::runtime::Runtime;
use tollgate::simulate::{self, RunResult, Simulation};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every run of an example, by name.
fn runs(example: &str) -> Vec<RunResult> {
    let path = repo().join("examples/simulations").join(example);
    let sim = Simulation::load(&path).unwrap();
    let runtime = Runtime::new().unwrap();
    simulate::plans(&sim, &[])
        .unwrap()
        .iter()
        .map(|p| simulate::run_plan(p, &runtime, Path::new(".")).unwrap())
        .collect()
}

fn named<'a>(runs: &'a [RunResult], name: &str) -> &'a RunResult {
    runs.iter().find(|r| r.summary.name == name).unwrap()
}

/// The backlog of the first tenant at `t_s` seconds.
fn backlog_at(run: &RunResult, t_s: i64) -> u32 {
    let k = run
        .series
        .t_ms
        .iter()
        .position(|&t| t == t_s * 1000)
        .unwrap();
    run.series.backlog[0][k]
}

#[test]
fn a_queue_is_not_capacity_the_backlog_grows_four_a_second_until_the_bound() {
    let runs = runs("queue-is-not-capacity.json");
    let offered: Vec<u64> = runs.iter().map(|r| r.summary.overall.offered).collect();
    assert!(
        offered.iter().all(|&o| o == 4000),
        "same arrivals: {offered:?}"
    );

    let big = named(&runs, "queue 1200");
    let slope = (backlog_at(big, 250) as f64 - backlog_at(big, 50) as f64) / 200.0;
    assert!((3.8..=4.2).contains(&slope), "backlog grows {slope}/s");
    // Held at the bound (a sample sees the claims and arrival of its own millisecond).
    let held = backlog_at(big, 350);
    assert!((1190..=1200).contains(&held), "held at the bound: {held}");
    let app = &big.summary.tenants["app"];
    assert!(app.wait_ms.p99.unwrap() > 100_000, "{:?}", app.wait_ms);
    assert!(app.refused["queue_full"] > 0);

    let small = named(&runs, "queue 12");
    assert!(small.series.backlog[0].iter().all(|&b| b <= 12));
    assert!(small.summary.tenants["app"].wait_ms.p99.unwrap() <= 3_000);
    // Both serve six a second: the bigger queue only makes callers wait.
    let done = |r: &RunResult| r.summary.overall.completed as f64 / 400.0;
    assert!((5.8..=6.0).contains(&done(small)) && (5.8..=6.0).contains(&done(big)));

    let deadline = named(&runs, "queue 1200, deadline 30 s");
    let app = &deadline.summary.tenants["app"];
    assert!(app.expired > 1000, "expired {}", app.expired);
    assert!(app.past_deadline >= app.expired);
    assert!(app.wait_ms.p99.unwrap() <= 30_000, "{:?}", app.wait_ms);
    assert_eq!(deadline.summary.overall.past_deadline, app.past_deadline);
}

#[test]
fn wrr_shares_jobs_and_drr_shares_tokens_by_weight() {
    let runs = runs("wrr-vs-drr.json");
    let near = |x: f64, want: f64| (x - want).abs() <= 0.03;
    let wrr = &named(&runs, "wrr 2:1:1").summary.tenants;
    for (t, want) in [("a", 0.5), ("b", 0.25), ("c", 0.25)] {
        assert!(
            near(wrr[t].request_share, want),
            "wrr {t}: {}",
            wrr[t].request_share
        );
    }
    // Equal counts are not equal tokens: b's large jobs take the most tokens under WRR.
    assert!(wrr["b"].token_share > 0.45, "{}", wrr["b"].token_share);
    let drr = &named(&runs, "drr_tokens 2:1:1").summary;
    for (t, want) in [("a", 0.5), ("b", 0.25), ("c", 0.25)] {
        let share = drr.tenants[t].token_share;
        assert!(near(share, want), "drr {t}: {share}");
    }
    assert!(drr.overall.jain_fairness_tokens.unwrap() > 0.99);
    let wrr_jain = named(&runs, "wrr 2:1:1")
        .summary
        .overall
        .jain_fairness_tokens;
    assert!(wrr_jain.unwrap() < 0.9, "{wrr_jain:?}");
    assert!(
        drr.overall.max_service_difference_tokens * 10
            < named(&runs, "wrr 2:1:1")
                .summary
                .overall
                .max_service_difference_tokens
    );
}

#[test]
fn a_tenant_limit_keeps_room_for_the_quiet_tenant() {
    let runs = runs("noisy-neighbour.json");
    let refused = |name: &str| named(&runs, name).summary.tenants["quiet"].refused_total;
    assert!(
        refused("tenant limit") * 5 < refused("no tenant limit"),
        "{} against {}",
        refused("tenant limit"),
        refused("no tenant limit")
    );
}

/// Callers that wait in the waiting room: the light tenant is served whole, in time and
/// never refused, where refused at once it loses half its calls; the provider is kept
/// busier; the shares are fairer.
#[test]
fn callers_that_wait_their_turn_serve_the_light_tenant_whole() {
    let runs = runs("waiting-room.json");
    let now = &named(&runs, "refused at once").summary;
    let wait = &named(&runs, "waiting room").summary;
    let light = &wait.tenants["light"];
    assert_eq!(light.completed, light.offered);
    assert_eq!(light.refused_total, 0);
    assert!(
        light.latency_ms.p99.unwrap() < 2_000,
        "{:?}",
        light.latency_ms
    );
    assert!(now.tenants["light"].completed * 3 < light.completed * 2);
    assert!(wait.overall.completed > now.overall.completed);
    assert!(wait.overall.provider_occupancy_mean > now.overall.provider_occupancy_mean);
    assert!(wait.overall.jain_fairness_tokens > now.overall.jain_fairness_tokens);
    // The noisy tenant's overload is shed at its own bound, not by the light tenant.
    assert!(wait.tenants["noisy"].refused.contains_key("queue_full"));
    assert!(!wait.tenants["noisy"]
        .refused
        .contains_key("global_concurrency"));
}

#[test]
fn callers_that_honour_retry_after_make_no_storm() {
    let runs = runs("retry-storm.json");
    let storm = &named(&runs, "retry every 100 ms").summary.overall;
    let calm = &named(&runs, "retry after Retry-After").summary.overall;
    assert!(
        storm.refused > 3 * calm.refused,
        "{} against {}",
        storm.refused,
        calm.refused
    );
    assert!(calm.completed >= storm.completed);
}

#[test]
fn reserved_routing_serves_what_one_deployment_cannot_and_no_deployment_answers_429() {
    let runs = runs("provider-limits.json");
    let reserved = &named(&runs, "reserved, two deployments").summary;
    let one = &named(&runs, "one deployment").summary;
    let learned = &named(&runs, "learned, two deployments").summary;
    // Reserved: every call served, none refused by the provider, each deployment within
    // its own minute, and east (60 a minute) taking about twice west's (30).
    let (east, west) = (&reserved.deployments["east"], &reserved.deployments["west"]);
    assert_eq!((east.rate_limited, west.rate_limited), (0, 0));
    assert_eq!(reserved.overall.refused, 0);
    assert_eq!(
        reserved.overall.completed,
        reserved.overall.offered - reserved.tenants["app"].pending_at_end
    );
    assert!(
        reserved.overall.completed >= 445,
        "{}",
        reserved.overall.completed
    );
    let share = east.sent as f64 / (east.sent + west.sent) as f64;
    assert!((0.6..0.73).contains(&share), "east took {share}");
    let app = &reserved.tenants["app"];
    assert!(app.latency_ms.p99.unwrap() <= 1_600, "{:?}", app.latency_ms);
    let series = &named(&runs, "reserved, two deployments").series;
    // Never past a deployment's limit in any minute (12 samples of 5 s): its minute's
    // worth, plus the first minute's full window.
    for (name, limit) in [("east", 60u64), ("west", 30)] {
        let sent = &series.deployment_sent[name];
        for w in sent.windows(12) {
            assert!(w.iter().sum::<u64>() <= 2 * limit, "{name}: {w:?}");
        }
    }
    // One deployment: the provider refuses, callers wait and ask again, fewer are served
    // and slower.
    assert!(one.deployments["east"].rate_limited > 0);
    assert!(!one.deployments.contains_key("west") || one.deployments["west"].sent == 0);
    assert!(one.overall.completed * 10 < reserved.overall.completed * 8);
    let slow = one.tenants["app"].latency_ms.p50.unwrap();
    assert!(slow > 5 * app.latency_ms.p50.unwrap(), "{slow}");
    // Learned: both limits found from the provider's reports, fewer 429s than one
    // deployment takes, and the load served.
    let said_no = learned
        .deployments
        .values()
        .map(|d| d.rate_limited)
        .sum::<u64>();
    assert!(learned.overall.completed >= reserved.overall.completed * 9 / 10);
    assert!(
        said_no * 4 < one.deployments["east"].rate_limited,
        "{said_no}"
    );
    assert!(learned.deployments["west"].sent > 100);
}

fn tollgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_command_compares_policies_on_the_same_arrivals_and_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("small.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "description": "Two tenants <b>and</b> a small provider.",
            "duration_ms": 20000, "seed": 9,
            "config": {"tenants": {"a": {}, "b": {"weight": 3}}},
            "tenants": {
                "a": {"arrivals": {"kind": "poisson", "per_s": 8}, "input_tokens": 100, "max_output_tokens": 50},
                "b": {"arrivals": {"kind": "constant", "per_s": 4}, "route": "durable",
                      "input_tokens": {"min": 10, "max": 90}, "max_output_tokens": 50, "deadline_ms": 5000}
            },
            "provider": {"concurrency": 4, "base_ms": 300, "failures": {"unavailable": 0.1, "unknown": 0.02}},
            "callers": {"on_refusal": "retry_after", "max_retries": 2}
        })
        .to_string(),
    )
    .unwrap();
    let out_dir = dir.path().join("report");
    let run = |out: &Path| {
        tollgate(&[
            "simulate",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--policy",
            "standard",
            "--policy",
            "deny-all",
        ])
    };
    let out = run(&out_dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    let runs = summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["overall"]["offered"], runs[1]["overall"]["offered"]);
    assert_eq!(
        summary["tenants"], runs[0]["tenants"],
        "the first run at the top"
    );
    assert_eq!(runs[1]["policy"]["name"], "deny-all");
    assert_eq!(runs[1]["overall"]["completed"], 0);
    assert!(runs[0]["overall"]["completed"].as_u64().unwrap() > 100);
    for field in [
        "wait_ms",
        "latency_ms",
        "refused",
        "token_share",
        "request_share",
        "past_deadline",
    ] {
        assert!(!runs[0]["tenants"]["a"][field].is_null(), "{field}");
    }
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        12,
        "six plots for each of two runs"
    );
    assert!(
        html.contains("&lt;b&gt;and&lt;/b&gt;"),
        "the description is escaped"
    );
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "self-contained"
    );
    for plot in [
        "backlog",
        "waits",
        "refusals",
        "expirations",
        "token_share",
        "occupancy",
    ] {
        let svg = std::fs::read_to_string(out_dir.join(format!("{plot}-standard.svg"))).unwrap();
        assert!(svg.starts_with("<svg"), "{plot}");
    }
    // The same file and seed give the same summary.
    let again = dir.path().join("again");
    assert!(run(&again).status.success());
    assert_eq!(
        std::fs::read(out_dir.join("summary.json")).unwrap(),
        std::fs::read(again.join("summary.json")).unwrap()
    );
}

#[test]
fn plots_are_readable_and_a_single_tenant_gets_no_fairness_plot() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "duration_ms": 10000, "seed": 3,
            "config": {"tenants": {"solo": {"requests": {"capacity": 1000, "refill_per_s": 1000},
                                            "queue_limit": 1000}}},
            "tenants": {"solo": {"arrivals": {"kind": "constant", "per_s": 20}, "route": "durable",
                                 "input_tokens": 10, "max_output_tokens": 10, "deadline_ms": 1500}},
            "provider": {"concurrency": 2, "base_ms": 400}
        })
        .to_string(),
    )
    .unwrap();
    let out_dir = dir.path().join("report");
    let out = tollgate(&[
        "simulate",
        file.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        5,
        "no token share for one tenant"
    );
    assert!(!out_dir.join("token_share-standard.svg").exists());
    // Expirations are plotted: the provider cannot keep up with the deadlines.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    let expired = summary["runs"][0]["overall"]["expired"].as_u64().unwrap();
    assert!(expired > 0, "jobs expired: {summary}");
    let svg = std::fs::read_to_string(out_dir.join("expirations-standard.svg")).unwrap();
    assert!(svg.contains("Expired jobs per tenant"), "{svg}");
    // Text no smaller than 15 px anywhere in a plot.
    for size in svg
        .split("font-size=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse::<f64>().unwrap())
    {
        assert!(size >= 15.0, "a font of {size} px");
    }
}

#[test]
fn a_bad_file_is_refused_with_its_field_named_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.json");
    let out_dir = dir.path().join("report");
    let cases = [
        (
            serde_json::json!({"duration_ms": 1000, "config": {}, "tenants": {}, "provider": {"concurrency": 1, "base_ms": 1}, "extra": 1}),
            "extra",
        ),
        (
            serde_json::json!({"duration_ms": 1000, "config": {"tenants": {}},
            "tenants": {"ghost": {"arrivals": {"kind": "constant", "per_s": 1}, "input_tokens": 1, "max_output_tokens": 1}},
            "provider": {"concurrency": 1, "base_ms": 1}}),
            "ghost",
        ),
        (
            serde_json::json!({"duration_ms": 1000, "config": {"tenants": {"a": {}}, "surprise": true},
            "tenants": {"a": {"arrivals": {"kind": "constant", "per_s": 1}, "input_tokens": 1, "max_output_tokens": 1}},
            "provider": {"concurrency": 1, "base_ms": 1}}),
            "surprise",
        ),
        (
            serde_json::json!({"duration_ms": 604_800_000, "config": {"tenants": {"a": {}}},
            "tenants": {"a": {"arrivals": {"kind": "constant", "per_s": 1_000_000}, "input_tokens": 1, "max_output_tokens": 1}},
            "provider": {"concurrency": 1, "base_ms": 1}}),
            "5000000 arrivals",
        ),
        (
            serde_json::json!({"duration_ms": 600_000, "sample_ms": 10,
            "config": {"tenants": (0..400).map(|i| (format!("t{i}"), serde_json::json!({}))).collect::<serde_json::Map<_, _>>()},
            "tenants": (0..400).map(|i| (format!("t{i}"), serde_json::json!({"arrivals": {"kind": "constant", "per_s": 0.01}, "input_tokens": 1, "max_output_tokens": 1}))).collect::<serde_json::Map<_, _>>(),
            "provider": {"concurrency": 1, "base_ms": 1}}),
            "raise sample_ms",
        ),
    ];
    for (json, word) in cases {
        std::fs::write(&file, json.to_string()).unwrap();
        let out = tollgate(&[
            "simulate",
            file.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(word), "{stderr}");
        assert!(!out_dir.exists(), "nothing written for {word}");
    }
}

#[test]
fn a_trace_replays_recorded_arrivals_and_a_bad_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..300u64 {
        let tenant = if i % 3 == 0 { "b" } else { "a" };
        lines.push_str(&format!(
            "{{\"t_ms\": {}, \"tenant\": \"{tenant}\", \"route\": \"durable\", \"input_tokens\": 100, \"max_output_tokens\": 20, \"deadline_ms\": 60000, \"priority\": \"critical\"}}\n",
            i * 50
        ));
    }
    std::fs::write(dir.path().join("recorded.jsonl"), &lines).unwrap();
    let sim_json = serde_json::json!({
        "duration_ms": 30000, "seed": 1,
        "config": {"tenants": {"a": {}, "b": {}}, "tenant_defaults": {"queue_limit": 500, "requests": {"capacity": 1000, "refill_per_s": 1000}}},
        "trace": "recorded.jsonl",
        "provider": {"concurrency": 4, "base_ms": 100}
    });
    let path = dir.path().join("trace.json");
    let sim = Simulation::from_json(&path, sim_json.clone()).unwrap();
    let plan = &simulate::plans(&sim, &[]).unwrap()[0];
    let run = simulate::run_plan(plan, &Runtime::new().unwrap(), Path::new(".")).unwrap();
    let t = &run.summary.tenants;
    assert_eq!((t["a"].offered, t["b"].offered), (200, 100));
    assert_eq!(t["a"].completed + t["b"].completed, 300, "{t:?}");

    std::fs::write(
        dir.path().join("recorded.jsonl"),
        format!("{lines}{{\"t_ms\": 5, \"tenant\": \"a\", \"input_tokens\": 1}}\n"),
    )
    .unwrap();
    let sim = Simulation::from_json(&path, sim_json).unwrap();
    let plan = &simulate::plans(&sim, &[]).unwrap()[0];
    let err = simulate::run_plan(plan, &Runtime::new().unwrap(), Path::new(".")).unwrap_err();
    assert!(
        err.contains("line 301") && err.contains("max_output_tokens"),
        "{err}"
    );
}
