//! `report.html`: one page, no outside assets, the runs side by side (one column each) with
//! the summary table under their plots.

use tollgate::simulate::{summary::Percentiles, RunResult, Simulation};

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
         .runs{{display:grid;grid-template-columns:repeat({},minmax(360px,1fr));gap:1em}}\
         .runs svg{{width:100%;height:auto}}table{{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1em}}\
         td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}th:first-child,td:first-child{{text-align:left}}\
         h2{{font-size:1.1em}}</style></head><body>\n",
        escape(&title),
        runs.len().max(1)
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
        h.push_str(
            "<table><tr><th>tenant</th><th>offered</th><th>admitted</th><th>refused</th>\
            <th>expired</th><th>completed</th><th>past deadline</th><th>wait s p50/p95/p99</th>\
            <th>latency s p50/p95/p99</th><th>token share</th><th>request share</th></tr>\n",
        );
        for (name, t) in &s.tenants {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td></tr>\n",
                escape(name),
                t.offered,
                t.admitted,
                escape(
                    &t.refused
                        .iter()
                        .map(|(r, n)| format!("{r}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                t.refused_total,
                t.expired,
                t.completed,
                t.past_deadline,
                ms(&t.wait_ms),
                ms(&t.latency_ms),
                t.token_share,
                t.request_share,
            ));
        }
        h.push_str("</table>\n");
        for (_, svg) in drawn {
            // plotters writes an XML declaration-free <svg> element; inline it as is.
            h.push_str("<figure>");
            h.push_str(svg);
            h.push_str("</figure>\n");
        }
        h.push_str("</section>\n");
    }
    h.push_str("</div>\n</body></html>\n");
    h
}
