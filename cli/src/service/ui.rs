//! `GET /ui`: the live dashboard, one page carried in the binary (no CDN, works offline).
//! The page holds no data: it asks for the admin key and reads the same JSON and metrics
//! endpoints as every other client, with that key.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("ui/index.html");

pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Its own script and style only; it talks to this server alone.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE,
    )
        .into_response()
}
