//! The metrics endpoint (`--metrics-listen`, off by default): HTTP/1.1,
//! `GET /metrics` with `Authorization: Bearer <token>` (the file given with
//! `--metrics-token-file`; Prometheus reads it with `authorization:
//! credentials_file`), answered in the Prometheus text format. Bounded as
//! every listener here: at most [`MAX_CONNECTIONS`] at once (more are
//! closed as they arrive), a request header within [`HEADER_DEADLINE`], a
//! whole connection within [`CONNECTION_LIMIT`], accept errors backed off.
//!
//! It only reads [`Metrics`]; a scrape changes nothing.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use oncilla_proto::auth::{ct_eq, Token};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Metrics;
use crate::listen::AcceptBackoff;

/// Most metrics connections open at once.
pub const MAX_CONNECTIONS: usize = 16;
/// A request's header must be in within this.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// A metrics connection is closed after this, whatever it does.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(60);

/// Serves `metrics` on `listener` to scrapers presenting `token`, until
/// the daemon stops.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, token: Token) {
    let token = Arc::new(token);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = AcceptBackoff::new("metrics");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => {
                backoff.ok();
                s
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed(&e)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "metrics connection refused: too many open");
            continue;
        };
        let (metrics, token) = (Arc::clone(&metrics), Arc::clone(&token));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let reply = answer(&req, &metrics, &token);
                async move { Ok::<_, Infallible>(reply) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_DEADLINE)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIMIT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection ended"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed at its time limit"),
            }
            drop(slot);
        });
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}

/// The reply to one request: the metrics, or why not.
fn answer(req: &Request<Incoming>, metrics: &Metrics, token: &Token) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if !ct_eq(presented, token.as_bytes()) {
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            "unauthorized: send Authorization: Bearer <the --metrics-token-file token>\n",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
