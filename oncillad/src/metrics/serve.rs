//! The metrics endpoint (`--metrics-listen`, off by default): HTTP/1.1
//! (over TLS with the daemon's certificate in a TLS cluster, so the token
//! never crosses the network in clear),
//! `GET /metrics` with `Authorization: Bearer <token>` (the file given with
//! `--metrics-token-file`; Prometheus reads it with `authorization:
//! credentials_file`), answered in the Prometheus text format. Bounded as
//! every listener here: a connection holds a place in a small [`Pending`]
//! budget ([`MAX_PENDING`], [`MAX_PENDING_PER_PEER`] from one address, the
//! oldest evicted first) until a request of its presents the token; only
//! then does it take one of [`MAX_CONNECTIONS`] seats, which strangers
//! never reach. A request without the token is answered and its
//! connection closed, so keeping a connection alive needs the token. A
//! request header within [`HEADER_DEADLINE`], a whole connection within
//! [`CONNECTION_LIMIT`], accept errors backed off.
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
use oncilla_model::secret::ct_eq;
use oncilla_net::auth::Token;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Metrics;
use crate::listen::{AcceptBackoff, Pending, Ticket};

/// Most metrics connections that presented the token, open at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Most connections that have not presented it yet.
pub const MAX_PENDING: usize = 16;
/// Of those, most from one address.
pub const MAX_PENDING_PER_PEER: usize = 8;
/// A request's header must be in within this.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// A metrics connection is closed after this, whatever it does.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(60);

/// Serves `metrics` on `listener` to scrapers presenting `token`, over
/// TLS with `tls` where the cluster has it, until the daemon stops.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    token: Token,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let token = Arc::new(token);
    let seats = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let pending = Pending::new(MAX_PENDING, MAX_PENDING_PER_PEER);
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
        let ticket = match pending.admit(&stream, Some(peer.ip())) {
            Ok(t) => t,
            Err(e) => {
                drop(stream);
                tokio::time::sleep(backoff.failed(&e)).await;
                continue;
            }
        };
        let place = Arc::new(std::sync::Mutex::new(Place::Pending(ticket)));
        let (metrics, token, seats) =
            (Arc::clone(&metrics), Arc::clone(&token), Arc::clone(&seats));
        let service = hyper::service::service_fn(move |req| {
            let reply = answer(&req, &metrics, &token, &place, &seats);
            async move { Ok::<_, Infallible>(reply) }
        });
        let tls = tls.clone();
        tokio::spawn(async move {
            let ended = match tls {
                None => tokio::time::timeout(CONNECTION_LIMIT, http(stream, service)).await,
                Some(tls) => {
                    tokio::time::timeout(CONNECTION_LIMIT, async move {
                        // The handshake is part of the header's deadline.
                        match tokio::time::timeout(HEADER_DEADLINE, tls.accept(stream)).await {
                            Ok(Ok(stream)) => http(stream, service).await,
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err("no TLS handshake within the deadline".into()),
                        }
                    })
                    .await
                }
            };
            match ended {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection ended"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed at its time limit"),
            }
        });
    }
}

/// Serves HTTP/1.1 requests on `io` with `service` until the peer or a
/// deadline ends it.
async fn http<Io, S>(io: Io, service: S) -> Result<(), String>
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
        Request<Incoming>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .await
        .map_err(|e| e.to_string())
}

/// Where a connection stands: in the pending budget, or in a seat once a
/// request of its presented the token.
enum Place {
    Pending(Ticket),
    /// Held for as long as the connection lives.
    Seated {
        _seat: OwnedSemaphorePermit,
    },
}

/// A reply that ends its connection (a caller without the token keeps no
/// connection open).
fn closing(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// The reply to one request: the metrics, or why not. The first request
/// that presents the token moves its connection from the pending budget
/// into a seat.
fn answer(
    req: &Request<Incoming>,
    metrics: &Metrics,
    token: &Token,
    place: &std::sync::Mutex<Place>,
    seats: &Arc<Semaphore>,
) -> Response<Full<Bytes>> {
    if let Place::Pending(ticket) = &*place.lock().unwrap_or_else(|e| e.into_inner()) {
        // It has spoken: evicted only after strangers that have not.
        ticket.heard();
    }
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if !ct_eq(presented, token.as_bytes()) {
        let mut r = closing(
            StatusCode::UNAUTHORIZED,
            "unauthorized: send Authorization: Bearer <the --metrics-token-file token>\n",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    {
        let mut place = place.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*place, Place::Pending(_)) {
            let Ok(seat) = Arc::clone(seats).try_acquire_owned() else {
                return closing(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy: every metrics connection is taken by scrapers; retry\n",
                );
            };
            *place = Place::Seated { _seat: seat };
        }
    }
    if req.uri().path() != "/metrics" {
        return closing(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET {
        return closing(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
