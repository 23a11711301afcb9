//! What `tollgate simulate` writes: `summary.json`, one SVG per plot and run, and
//! `report.html`, one self-contained page with the plots side by side and the summary.

mod html;
mod plots;

use std::path::Path;
use tollgate::simulate::{RunResult, Simulation};

/// The stem files of a run carry: its name in lower case, other characters as `-`.
pub fn slug(name: &str, taken: &mut Vec<String>) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s = s
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    if s.is_empty() {
        s = "run".into();
    }
    s.truncate(48);
    let base = s.clone();
    let mut n = 2;
    while taken.contains(&s) {
        s = format!("{base}-{n}");
        n += 1;
    }
    taken.push(s.clone());
    s
}

/// Writes every output of `runs` into `dir` (created); the paths written.
pub fn write(dir: &Path, sim: &Simulation, runs: &[RunResult]) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let put = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut written = Vec::new();
    // The first run's fields at the top, so a one-run summary reads directly; every run
    // under `runs`, in the order compared.
    let mut summary = serde_json::to_value(&runs[0].summary).map_err(|e| e.to_string())?;
    summary["simulation"] = serde_json::json!(sim.path.display().to_string());
    summary["runs"] = serde_json::to_value(runs.iter().map(|r| &r.summary).collect::<Vec<_>>())
        .map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    put("summary.json", text.as_bytes())?;
    written.push("summary.json".to_string());
    let mut taken = Vec::new();
    let mut drawn = Vec::new();
    for run in runs {
        let stem = slug(&run.summary.name, &mut taken);
        let concurrency = sim.provider.concurrency;
        let mut files = Vec::new();
        for (plot, svg) in plots::all(run, concurrency) {
            let name = format!("{plot}-{stem}.svg");
            put(&name, svg.as_bytes())?;
            written.push(name.clone());
            files.push((plot, svg));
        }
        drawn.push(files);
    }
    put("report.html", html::page(sim, runs, &drawn).as_bytes())?;
    written.push("report.html".to_string());
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_file_safe_and_unique() {
        let mut taken = Vec::new();
        assert_eq!(
            slug("Queue 1200 · standard", &mut taken),
            "queue-1200-standard"
        );
        assert_eq!(
            slug("queue 1200 / standard", &mut taken),
            "queue-1200-standard-2"
        );
        assert_eq!(slug("../..", &mut taken), "run");
    }
}
