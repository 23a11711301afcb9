//! Lingering close: what a client is still sending of a body the server did not read is
//! read and thrown away (bounded) before the answer goes out.
//!
//! A handler refuses before reading (401, 403, 404, 405) or stops reading at the size limit
//! (413). Most clients write the whole body before they read the answer; closing the
//! connection under one that is still writing resets it, and it never sees the answer. So
//! every request's body is lent to the handler, and what the handler left unread is drained
//! here, at most [`DRAIN_BYTES`] for at most [`DRAIN_TIME`]; past that the client is cut off.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

/// At most this much of an unread body is read and thrown away...
const DRAIN_BYTES: usize = 8 << 20;
/// ...and for at most this long.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The layer: lends the body to the handler, then drains what it left unread.
pub async fn linger(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    // A client waiting for `100 Continue` has sent nothing until the body is first read:
    // if the handler never read it, the answer goes out without asking for the body.
    let waits = parts
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let lent = Arc::new(Mutex::new(Lent { body, read: false }));
    let handler_body = Body::new(Borrowed(lent.clone()));
    let response = next.run(Request::from_parts(parts, handler_body)).await;
    // A client too slow to send its body (408) has had its time.
    if response.status() == StatusCode::REQUEST_TIMEOUT {
        return response;
    }
    // The handler has answered, so its borrow has ended; if it has not, nothing is drained.
    let Some(Lent { mut body, read }) = Arc::into_inner(lent).map(into_inner) else {
        return response;
    };
    if !body.is_end_stream() && (read || !waits) {
        drain(&mut body).await;
    }
    response
}

/// The request body and whether the handler has started reading it.
struct Lent {
    body: Body,
    read: bool,
}

/// The handler's view of a [`Lent`] body.
struct Borrowed(Arc<Mutex<Lent>>);

impl Borrowed {
    fn lent(&self) -> MutexGuard<'_, Lent> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn into_inner(lent: Mutex<Lent>) -> Lent {
    lent.into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl HttpBody for Borrowed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut lent = self.lent();
        lent.read = true;
        Pin::new(&mut lent.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.lent().body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.lent().body.size_hint()
    }
}

/// Reads and throws away what is left of `body`, within [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(body: &mut Body) {
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len());
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    })
    .await;
}
