//! The gateway's cost: proxied calls per second and the latency it adds, against the same
//! zero-latency OpenAI-compatible stub called directly, both in one run, plain and
//! streaming. The stub runs in this process; `tollgate serve` in its own.

use crate::http::start_serve;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

/// One workload's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// Calls per second with `connections` callers.
    pub calls_per_s: f64,
    /// Latency of one caller alone, to the answer's last byte, in ms.
    pub p50_ms: f64,
    /// The same, 99th percentile.
    pub p99_ms: f64,
}

/// Direct and proxied, plain and streaming.
#[derive(Clone, Debug, Serialize)]
pub struct GatewayFigures {
    /// Callers at once in the throughput runs.
    pub connections: usize,
    /// Calls per throughput run.
    pub calls: u64,
    /// The stub called directly, plain answers.
    pub direct_plain: Run,
    /// Through tollgate, plain answers.
    pub gateway_plain: Run,
    /// The stub called directly, streams.
    pub direct_stream: Run,
    /// Through tollgate, streams.
    pub gateway_stream: Run,
    /// Latency the gateway adds at the median, plain and streaming, in ms.
    pub added_p50_ms_plain: f64,
    /// The same for streams.
    pub added_p50_ms_stream: f64,
    /// Proxied over direct calls per second, plain.
    pub throughput_ratio_plain: f64,
    /// The same for streams.
    pub throughput_ratio_stream: f64,
    /// What the store keeps per call.
    pub store: StoreGrowth,
}

/// What the store grew by over the plain gateway run.
#[derive(Clone, Debug, Serialize)]
pub struct StoreGrowth {
    /// Finished operations the run left.
    pub finished_operations: u64,
    /// Bytes of the store's pages in use, per finished operation.
    pub bytes_per_finished_operation: f64,
    /// Rows of the spend ledger after the whole run.
    pub ledger_rows: u64,
    /// Hours those rows cover.
    pub ledger_hours: u64,
    /// Ledger rows per hour: tenants × models × deployments, whatever the call rate.
    pub ledger_rows_per_hour: f64,
}

/// The store's bytes in use (pages less the free list, the WAL's newer pages included),
/// its finished operations, its ledger rows, the hours they cover, and its operations that
/// did not succeed.
fn store_figures(db: &Path) -> Result<(u64, u64, u64, u64, u64), String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| e.to_string())?;
    let one = |sql: &str| -> Result<u64, String> {
        c.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| format!("{sql}: {e}"))
    };
    let pages = one("PRAGMA page_count")?;
    let free = one("PRAGMA freelist_count")?;
    let size = one("PRAGMA page_size")?;
    let finished = one(
        "SELECT COUNT(*) FROM operations WHERE state IN ('succeeded', 'failed_final', 'expired')",
    )?;
    let rows = one("SELECT COUNT(*) FROM spend")?;
    let hours = one("SELECT COUNT(DISTINCT hour_ms) FROM spend")?;
    // Every call to the stub should have succeeded.
    let failed = one("SELECT COUNT(*) FROM operations WHERE state <> 'succeeded'")?;
    Ok(((pages - free) * size, finished, rows, hours, failed))
}

const ANSWER: &str = r#"{"id":"chatcmpl-b","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
const STREAM: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"}}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
    "data: [DONE]\n\n"
);

/// The stub: answers every POST at once, a stream when the body asks for one.
async fn stub(listener: tokio::net::TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let body = req.into_body().collect().await?.to_bytes();
                const STREAMED: &[u8] = b"\"stream\":true";
                let stream = body.windows(STREAMED.len()).any(|w| w == STREAMED);
                let (kind, text) = if stream {
                    ("text/event-stream", STREAM)
                } else {
                    ("application/json", ANSWER)
                };
                Ok::<_, hyper::Error>(
                    Response::builder()
                        .header("content-type", kind)
                        .body(Full::new(Bytes::from_static(text.as_bytes())))
                        .unwrap(),
                )
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One call, read to its last byte; its time in ms.
async fn call(client: &HttpClient, url: &str, key: &str, stream: bool) -> Result<f64, String> {
    let body = if stream {
        r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#
    } else {
        r#"{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#
    };
    let request = Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let started = Instant::now();
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() || bytes.is_empty() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&bytes)));
    }
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

/// Latency alone (one caller, `alone` calls) and throughput (`connections` callers,
/// `calls` in all) against `url`.
async fn measure(
    url: &str,
    key: &str,
    stream: bool,
    alone: u64,
    connections: usize,
    calls: u64,
) -> Result<Run, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    for _ in 0..100 {
        call(&client, url, key, stream).await?;
    }
    let mut latencies = Vec::with_capacity(alone as usize);
    for _ in 0..alone {
        latencies.push(call(&client, url, key, stream).await?);
    }
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    let per = calls.div_ceil(connections as u64);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (client, url, key) = (client.clone(), url.to_string(), key.to_string());
        tasks.spawn(async move {
            for _ in 0..per {
                call(&client, &url, &key, stream).await?;
            }
            Ok::<_, String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(Run {
        calls_per_s: (per * connections as u64) as f64 / started.elapsed().as_secs_f64(),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}

/// Runs the four workloads: the stub directly and through `tollgate serve` (`serve`, with
/// its store in `dir`), plain and streaming.
pub fn gateway(
    serve: &Path,
    dir: &Path,
    connections: usize,
    calls: u64,
    deployments: usize,
) -> Result<GatewayFigures, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| e.to_string())?;
    let stub_addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    rt.spawn(stub(listener));
    let mut config = crate::store::admit_config_json(1);
    config["auth"] = serde_json::json!({"callers": {"bench-key": "t00000"}});
    // One deployment: the one-upstream form. Several: each with a request bucket and a
    // concurrency limit that never run short, so every budget of each is read and written.
    let model = match deployments {
        0 | 1 => serde_json::json!({"upstream": "stub", "tokenizer": "o200k_base"}),
        n => {
            serde_json::json!({"tokenizer": "o200k_base", "deployments": (0..n).map(|i| serde_json::json!({
            "name": format!("d{i}"), "upstream": "stub", "max_concurrency": 100_000,
            "requests": {"capacity": 1e9, "refill_per_s": 1e6}})).collect::<Vec<_>>()})
        }
    };
    config["gateway"] = serde_json::json!({
        "upstreams": {"stub": {"base_url": format!("http://{stub_addr}/v1")}},
        "models": {"bench": model},
    });
    let (_server, addr) = start_serve(serve, dir, &config)?;
    let db = dir.join("http.db");
    let direct = format!("http://{stub_addr}/v1/chat/completions");
    let proxied = format!("http://{addr}/v1/chat/completions");
    let alone = (calls / 5).max(200);
    rt.block_on(async {
        let direct_plain = measure(&direct, "none", false, alone, connections, calls).await?;
        let (bytes_before, ops_before, ..) = store_figures(&db)?;
        let gateway_plain =
            measure(&proxied, "bench-key", false, alone, connections, calls).await?;
        // The last completions are written by the writer's next batch.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (bytes_after, ops_after, ..) = store_figures(&db)?;
        let direct_stream = measure(&direct, "none", true, alone, connections, calls).await?;
        let gateway_stream =
            measure(&proxied, "bench-key", true, alone, connections, calls).await?;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (_, _, ledger_rows, ledger_hours, unfinished) = store_figures(&db)?;
        if unfinished > 0 {
            return Err(format!(
                "{unfinished} gateway calls did not end `succeeded` (see {})",
                dir.join("serve.log").display()
            ));
        }
        let finished = ops_after.saturating_sub(ops_before);
        let store = StoreGrowth {
            finished_operations: finished,
            bytes_per_finished_operation: bytes_after.saturating_sub(bytes_before) as f64
                / finished.max(1) as f64,
            ledger_rows,
            ledger_hours,
            ledger_rows_per_hour: ledger_rows as f64 / ledger_hours.max(1) as f64,
        };
        Ok(GatewayFigures {
            store,
            connections,
            calls,
            added_p50_ms_plain: gateway_plain.p50_ms - direct_plain.p50_ms,
            added_p50_ms_stream: gateway_stream.p50_ms - direct_stream.p50_ms,
            throughput_ratio_plain: gateway_plain.calls_per_s / direct_plain.calls_per_s,
            throughput_ratio_stream: gateway_stream.calls_per_s / direct_stream.calls_per_s,
            direct_plain,
            gateway_plain,
            direct_stream,
            gateway_stream,
        })
    })
}
