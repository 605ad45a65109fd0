//! The gRPC servers' streams of connections (the TCP port and the session
//! Unix socket), in place of tonic's `TcpIncoming` and tokio's
//! `UnixListenerStream` (which retry a failing `accept` at once, forever):
//! at most [`MAX_GRPC_CONNECTIONS`] open at once (more are closed as they
//! arrive), on the session socket at most [`MAX_GRPC_PER_USER`] of them
//! from one user (the kernel's `SO_PEERCRED`), so one tenant cannot take
//! every connection from the others; a connection must send the HTTP/2 client preface within
//! [`PREFACE_DEADLINE`] and holds a place in a small [`Pending`] budget
//! until it has, and on the TCP port until its first call the
//! interceptor admits (its [`Unproven`]): a peer without the token keeps a
//! connection only inside that budget, where newcomers evict it. Accept
//! errors back off ([`AcceptBackoff`]).
//!
//! Authentication stays with the services' interceptors; this module only
//! decides which connections exist. It never parses HTTP/2 beyond counting
//! the preface's bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use std::net::IpAddr;
use std::os::fd::AsFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use oncilla_net::proven::{Conn, Unproven};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use super::users::{UserPlace, Users};
use super::{AcceptBackoff, Pending, Ticket};

/// Most gRPC connections open at once.
pub const MAX_GRPC_CONNECTIONS: usize = 4096;
/// Of those, most from one user on the session socket: an eighth, so
/// seven other users always find room.
pub const MAX_GRPC_PER_USER: usize = MAX_GRPC_CONNECTIONS / 8;
/// Most gRPC connections that have not yet sent their preface.
pub const MAX_GRPC_PENDING: usize = 64;
/// Of those, most from one address.
pub const MAX_GRPC_PENDING_PER_PEER: usize = 32;
/// How long a new connection has to send the HTTP/2 client preface.
pub const PREFACE_DEADLINE: Duration = Duration::from_secs(5);
/// Length of the HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// A listening socket [`Incoming`] can take connections from.
pub trait Listen: Unpin {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Connected + AsFd + Unpin + Send + 'static;
    /// Names the listener in logs.
    const NAME: &'static str;

    /// Accepts a connection and the peer's address (`None`: peers are not
    /// told apart, as on a Unix socket).
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Io, Option<IpAddr>)>>;

    /// Sets up an accepted connection.
    fn prepare(_io: &Self::Io) -> io::Result<()> {
        Ok(())
    }

    /// The user on the other end, where the kernel says (Unix sockets):
    /// each gets at most [`MAX_GRPC_PER_USER`] connections. Where it does,
    /// a connection needs no proof past its preface.
    fn user(_io: &Self::Io) -> Option<u32> {
        None
    }

    /// Whether a connection keeps its pending place until its first
    /// admitted call (peers the kernel does not name).
    const PROVES: bool;
}

impl Listen for TcpListener {
    type Io = TcpStream;
    const NAME: &'static str = "gRPC";
    const PROVES: bool = true;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, Option<IpAddr>)>> {
        TcpListener::poll_accept(self, cx).map_ok(|(s, a)| (s, Some(a.ip())))
    }

    fn prepare(io: &TcpStream) -> io::Result<()> {
        // No Nagle: a reply split over several writes must not wait for the
        // peer's delayed ACK (40 ms stalls in the alloc/free tail).
        io.set_nodelay(true)
    }
}

impl Listen for UnixListener {
    type Io = UnixStream;
    const NAME: &'static str = "session socket";
    const PROVES: bool = false;

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(UnixStream, Option<IpAddr>)>> {
        UnixListener::poll_accept(self, cx).map_ok(|(s, _)| (s, None))
    }

    fn user(io: &UnixStream) -> Option<u32> {
        io.peer_cred().ok().map(|c| c.uid())
    }
}

/// Accepted gRPC connections, limited as the module doc says.
pub struct Incoming<L: Listen = TcpListener> {
    listener: L,
    open: Arc<Semaphore>,
    pending: Arc<Pending>,
    backoff: AcceptBackoff,
    pause: Option<Pin<Box<Sleep>>>,
    full: AcceptBackoff,
    users: Arc<Users>,
    /// Logs refusals past a user's share (rate-limited); never pauses.
    over: AcceptBackoff,
}

impl<L: Listen> Incoming<L> {
    /// Connections from `listener`.
    pub fn new(listener: L) -> Self {
        Self {
            listener,
            open: Arc::new(Semaphore::new(MAX_GRPC_CONNECTIONS)),
            pending: Pending::new(MAX_GRPC_PENDING, MAX_GRPC_PENDING_PER_PEER),
            backoff: AcceptBackoff::new(L::NAME),
            pause: None,
            full: AcceptBackoff::new(L::NAME),
            users: Users::new(MAX_GRPC_PER_USER),
            over: AcceptBackoff::new(L::NAME),
        }
    }

    fn take(
        &mut self,
        stream: L::Io,
        peer: Option<IpAddr>,
        user: Option<UserPlace>,
    ) -> io::Result<Guarded<L::Io>> {
        let Ok(permit) = Arc::clone(&self.open).try_acquire_owned() else {
            return Err(io::Error::other(format!(
                "too many gRPC connections ({MAX_GRPC_CONNECTIONS} open)"
            )));
        };
        let ticket = self.pending.admit(&stream, peer)?;
        L::prepare(&stream)?;
        Ok(Guarded {
            io: stream,
            preface: Some((ticket, 0, Box::pin(tokio::time::sleep(PREFACE_DEADLINE)))),
            proves: L::PROVES,
            unproven: Unproven::default(),
            _permit: permit,
            _user: user,
        })
    }
}

impl<L: Listen> tokio_stream::Stream for Incoming<L> {
    type Item = io::Result<Guarded<L::Io>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            let (stream, peer) = match ready!(self.listener.poll_accept(cx)) {
                Ok(s) => s,
                Err(e) => {
                    let pause = self.backoff.failed(&e);
                    if !pause.is_zero() {
                        self.pause = Some(Box::pin(tokio::time::sleep(pause)));
                    }
                    continue;
                }
            };
            self.backoff.ok();
            // A user past its share is refused alone: no pause for others.
            let user = L::user(&stream);
            let place = match self.users.share(user) {
                Ok(place) => place,
                Err(n) => {
                    drop(stream);
                    let e = io::Error::other(format!(
                        "user {} holds {n} session-socket connections, the most one user may",
                        user.unwrap_or_default()
                    ));
                    let _ = self.over.failed(&e);
                    continue;
                }
            };
            match self.take(stream, peer, place) {
                Ok(conn) => return Poll::Ready(Some(Ok(conn))),
                Err(e) => {
                    // Dropped here; out of descriptors pauses like accept.
                    let pause = self.full.failed(&e);
                    if !pause.is_zero() {
                        self.pause = Some(Box::pin(tokio::time::sleep(pause)));
                    }
                }
            }
        }
    }
}

/// One accepted gRPC connection with its places in the limits.
pub struct Guarded<Io> {
    io: Io,
    /// Until the preface is in: the pending place, bytes seen, the deadline.
    preface: Option<(Ticket, usize, Pin<Box<Sleep>>)>,
    /// Whether the pending place passes to `unproven` with the preface.
    proves: bool,
    /// Holds the pending place from the preface to the first admitted call.
    unproven: Unproven,
    _permit: OwnedSemaphorePermit,
    /// The connection's user's place, on the session socket.
    _user: Option<UserPlace>,
}

impl<Io: Connected> Connected for Guarded<Io> {
    type ConnectInfo = Conn<Io::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        Conn {
            info: self.io.connect_info(),
            unproven: self.unproven.clone(),
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Guarded<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some((_, seen, deadline)) = this.preface.as_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no HTTP/2 preface within the deadline",
            )));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        *seen += buf.filled().len() - before;
        if *seen >= PREFACE_LEN {
            if let Some((ticket, _, _)) = this.preface.take() {
                if this.proves {
                    // It has spoken: evicted only after strangers that
                    // have not.
                    ticket.heard();
                    this.unproven.hold(Box::new(ticket));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Guarded<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
