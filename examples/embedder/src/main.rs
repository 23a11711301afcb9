//! An embedding program on a SQLite file, from tokio: the engine started as the service
//! starts it ([`EngineBuilder`]), calls made through the library's writer (group commit,
//! awaited, never blocking a worker thread), and housekeeping on its own thread for the
//! engine used without the writer. Built without the library's `postgres` feature, so a
//! `postgres://` store is refused with a clear error rather than linked.
//!
//! `cargo run --manifest-path examples/embedder/Cargo.toml -- <file.db>`

use std::sync::Arc;
use std::time::Duration;
use tollgate::config::ConfigFile;
use tollgate::engine::{Completion, EngineBuilder};
use tollgate::model::{CallResult, Route, Usage};
use tollgate::reason::Outcome;
use tollgate::store::{AnyStore, SqliteStore, StoreError};
use tollgate::writer::NoObserver;
use tollgate::{maintenance, RequestBuilder, Writer};

/// Calls made at once from their own tasks.
const CONCURRENT: usize = 100;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "embedder.db".to_string());

    // This build has SQLite only: a PostgreSQL URL is refused, and says why.
    match AnyStore::open("postgres://localhost/tollgate") {
        Err(e @ StoreError::Unsupported(_)) => println!("postgres: {e}"),
        Err(e) => return Err(format!("a PostgreSQL URL failed otherwise: {e}").into()),
        Ok(_) => return Err("a PostgreSQL store opened in a SQLite-only build".into()),
    }

    // The same configuration the service reads; the engine started as the service starts.
    let file = ConfigFile::from_json(&serde_json::json!({
        "global": { "requests": { "capacity": 1000, "refill_per_s": 100 }, "concurrency": 1000 },
        "tenant_defaults": {
            "requests": { "capacity": 1000, "refill_per_s": 100 },
            "tokens": { "capacity": 2000000, "refill_per_s": 10000 }
        },
        "tenants": { "acme": {}, "globex": {} }
    }))?;
    let mut store = SqliteStore::open(std::path::Path::new(&db))?;
    store.checkpoint_in_background(Duration::from_millis(50), None)?;
    let started = EngineBuilder::new(file).start(store, now_ms())?;
    println!("policy: {:?}", started.adopted);
    let engine = Arc::new(started.engine);

    // The writer: one thread, one transaction per batch, awaited from any task. It also
    // keeps the engine swept while it runs.
    let (writer, writer_thread) = Writer::start(engine.clone(), CONCURRENT, Arc::new(NoObserver));

    let config = engine.config();
    let request = RequestBuilder::new("acme", "req-1", Route::Interactive)
        .input_tokens(300)
        .max_output_tokens(500)
        .deadline_ms(now_ms() + 60_000)
        .build(&config)?;
    let decision = writer.admit(request.clone(), now_ms()).await?;
    println!("admit: {}", serde_json::to_string(&decision)?);
    if decision.authorises_call() {
        let report = Completion {
            result: CallResult::Succeeded,
            usage: Some(Usage::new(300, 120)),
            ..Completion::succeeded("acme", "req-1")
        };
        let answer = writer.complete(report, now_ms()).await?;
        println!("complete: {}", serde_json::to_string(&answer)?);
    }
    let again = writer.admit(request, now_ms()).await?;
    println!("again: {}", serde_json::to_string(&again)?);

    // A bad request is refused before anything is spent, naming its field.
    let refused = RequestBuilder::new("acme", "req-2", Route::Interactive)
        .input_tokens(300)
        .deadline_ms(now_ms() + 60_000)
        .build(&config)
        .unwrap_err();
    println!("refused: {refused}");

    // Many tasks at once: their admissions share transactions, none blocks a worker.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CONCURRENT {
        let writer = writer.clone();
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        let request = RequestBuilder::new(tenant, format!("many-{i}"), Route::Interactive)
            .input_tokens(10)
            .max_output_tokens(10)
            .deadline_ms(now_ms() + 60_000)
            .build(&config)?;
        tasks.spawn(async move {
            let d = writer.admit(request, now_ms()).await?;
            let completed = Completion::succeeded(tenant, &format!("many-{i}"));
            writer.complete(completed, now_ms()).await?;
            if d.outcome != Outcome::Accepted {
                println!(
                    "not accepted: {}",
                    serde_json::to_string(&d).unwrap_or_default()
                );
            }
            Ok::<_, tollgate::writer::Failure>(d.outcome == Outcome::Accepted)
        });
    }
    let mut accepted = 0;
    while let Some(joined) = tasks.join_next().await {
        accepted += usize::from(joined??);
    }
    println!("concurrent: {accepted} of {CONCURRENT} accepted");
    drop(writer);
    writer_thread
        .join()
        .map_err(|_| "the writer thread panicked")?;

    // Used without a writer, the engine's housekeeping runs on a task of its own.
    let housekeeping = maintenance::spawn(engine.clone(), Arc::new(NoObserver))?;
    let direct = engine.admit(
        &serde_json::json!({
            "tenant": "globex", "key": "direct-1", "route": "interactive",
            "input_tokens": 10, "max_output_tokens": 10, "deadline_ms": now_ms() + 60_000
        }),
        now_ms(),
    )?;
    println!("direct: {:?}", direct.outcome);
    housekeeping.stop();
    Ok(())
}
