//! `report.html`: one page, no outside assets, one run per row: its summary table, then
//! its plots two to a row, so that any number of runs fits the page's width.

use tollgate::simulate::summary::{Percentiles, TenantSummary};
use tollgate::simulate::{RunResult, Simulation};

/// Text made safe for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(p: &Percentiles) -> String {
    let f = |v: Option<u32>| v.map_or("–".to_string(), |v| format!("{:.1}", v as f64 / 1000.0));
    format!("{} / {} / {}", f(p.p50), f(p.p95), f(p.p99))
}

/// The page.
pub fn page(sim: &Simulation, runs: &[RunResult], plots: &[Vec<(&str, String)>]) -> String {
    let mut h = String::new();
    let title = sim
        .path
        .file_stem()
        .map_or("simulation".into(), |s| s.to_string_lossy().to_string());
    h.push_str(&format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>tollgate simulate: {}</title>\
         <style>body{{font-family:sans-serif;margin:1.5em;color:#222}}\
         .run{{border-top:2px solid #ddd;padding-top:0.5em;margin-bottom:1.5em}}\
         .plots{{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(560px,100%),1fr));gap:1em}}\
         figure{{margin:0;min-width:0}}.plots svg{{width:100%;height:auto;display:block}}\
         table{{border-collapse:collapse;font-size:0.9em;margin:0.5em 0 1em}}\
         td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}tr th:first-child{{text-align:left;font-weight:normal}}\
         h2{{font-size:1.1em}}</style></head><body>\n",
        escape(&title),
    ));
    h.push_str(&format!("<h1>{}</h1>\n", escape(&title)));
    if let Some(d) = &sim.description {
        h.push_str(&format!("<p>{}</p>\n", escape(d)));
    }
    h.push_str(&format!(
        "<p>{} simulated seconds, seed {}, {} run(s) on the same arrivals.</p>\n",
        sim.duration_ms as f64 / 1000.0,
        sim.seed,
        runs.len()
    ));
    h.push_str("<div class=\"runs\">\n");
    for (run, drawn) in runs.iter().zip(plots) {
        let s = &run.summary;
        h.push_str(&format!(
            "<section class=\"run\"><h2>{}</h2><p>policy {} {} · Jain's index over weighted token shares {} · \
             most service difference between backlogged tenants {} tokens · callers past their deadline {}</p>\n",
            escape(&s.name),
            escape(&s.policy.name),
            escape(&s.policy.version),
            s.overall
                .jain_fairness_tokens
                .map_or("–".into(), |j| format!("{j:.3}")),
            s.overall.max_service_difference_tokens,
            s.overall.past_deadline,
        ));
        // One column per tenant, one row per measure.
        let tenants: Vec<_> = s.tenants.iter().collect();
        h.push_str("<table><tr><th></th>");
        for (name, _) in &tenants {
            h.push_str(&format!("<th>{}</th>", escape(name)));
        }
        h.push_str("</tr>\n");
        type Cell = fn(&TenantSummary) -> String;
        let rows: [(&str, Cell); 12] = [
            ("offered", |t| t.offered.to_string()),
            ("admitted", |t| t.admitted.to_string()),
            ("refused", |t| t.refused_total.to_string()),
            ("refused by reason", |t| {
                t.refused
                    .iter()
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
            ("expired", |t| t.expired.to_string()),
            ("completed", |t| t.completed.to_string()),
            ("failed", |t| t.failed_final.to_string()),
            ("past deadline", |t| t.past_deadline.to_string()),
            ("wait s p50/p95/p99", |t| ms(&t.wait_ms)),
            ("latency s p50/p95/p99", |t| ms(&t.latency_ms)),
            ("token share", |t| format!("{:.3}", t.token_share)),
            ("request share", |t| format!("{:.3}", t.request_share)),
        ];
        for (label, cell) in rows {
            h.push_str(&format!("<tr><th>{label}</th>"));
            for (_, t) in &tenants {
                h.push_str(&format!("<td>{}</td>", escape(&cell(t))));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n<div class=\"plots\">\n");
        for (_, svg) in drawn {
            // plotters writes an XML declaration-free <svg> element; inline it as is.
            h.push_str("<figure>");
            h.push_str(svg);
            h.push_str("</figure>\n");
        }
        h.push_str("</div>\n</section>\n");
    }
    h.push_str("</div>\n</body></html>\n");
    h
}
