//! The data port over TLS: a rustls session on the TCP socket, relayed to
//! one end of a Unix socket pair whose other end the data protocol uses as
//! it uses a plain TCP socket ([`DataStream`]). The protocol code, its
//! deadlines and its zero-copy `sendmsg`/`recvmsg` stay one code path; TLS
//! costs the relay's copies on top of the cipher (measured in
//! `docs/benchmarks.md`). Kernel TLS would spare them, where the kernel has
//! it; these hosts' kernels do not.
//!
//! Two threads per connection: `inbound` decrypts what the peer sends and
//! writes it to the pair, `outbound` encrypts what the protocol writes and
//! sends it. They share the rustls session under a lock held only while
//! encrypting or decrypting, never across a blocking call. Bounds: the
//! handshake fits in the caller's deadline; each relayed piece must leave
//! within the stall time plus its length at [`sock::MIN_RATE`], so a peer that stops reading, or trickles, ends the tunnel; when
//! either end closes or fails, both sockets are shut down and both threads
//! end.
//!
//! It never looks at the bytes it carries.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use crate::wire::sock;

/// Bytes relayed per step (a few TLS records).
const PIECE: usize = 64 << 10;
/// Stack of a relay thread (its buffers are on the heap).
const RELAY_STACK: usize = 256 << 10;

/// A data connection: plain TCP, or the plaintext end of a TLS tunnel.
#[derive(Debug)]
pub enum DataStream {
    Tcp(TcpStream),
    Tls(UnixStream),
}

impl DataStream {
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(t),
            Self::Tls(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(t),
            Self::Tls(s) => s.set_write_timeout(t),
        }
    }
}

impl AsFd for DataStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(s) => s.as_fd(),
            Self::Tls(s) => s.as_fd(),
        }
    }
}

impl Read for DataStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl Write for DataStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Serves TLS on an accepted `tcp` connection: the handshake by `until`,
/// then a tunnel whose pieces may stall at most `stall`.
///
/// # Errors
/// The handshake failed (its alert is sent), timed out, or no thread could
/// be started.
pub fn accept(
    tcp: TcpStream,
    config: &Arc<rustls::ServerConfig>,
    until: Instant,
    stall: Duration,
) -> io::Result<DataStream> {
    let conn = rustls::ServerConnection::new(Arc::clone(config)).map_err(invalid)?;
    tunnel(rustls::Connection::Server(conn), tcp, until, stall)
}

/// Speaks TLS on a connected `tcp` socket to the listener at `host`, whose
/// certificate must carry that name (or address) and chain to the cluster
/// CA: the handshake by `until`, then a tunnel as [`accept`]'s.
///
/// # Errors
/// As [`accept`]; `InvalidInput` for a host that is no valid name.
pub fn connect(
    tcp: TcpStream,
    config: &Arc<rustls::ClientConfig>,
    host: &str,
    until: Instant,
    stall: Duration,
) -> io::Result<DataStream> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} cannot name a TLS server: {e}"),
        )
    })?;
    let conn = rustls::ClientConnection::new(Arc::clone(config), name).map_err(invalid)?;
    tunnel(rustls::Connection::Client(conn), tcp, until, stall)
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

fn tunnel(
    mut conn: rustls::Connection,
    mut tcp: TcpStream,
    until: Instant,
    stall: Duration,
) -> io::Result<DataStream> {
    handshake(&mut conn, &mut tcp, until).map_err(|e| match e.kind() {
        // A socket timeout: the deadline passed inside a read or write.
        io::ErrorKind::WouldBlock => {
            io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
        }
        _ => e,
    })?;
    let (app, inner) = UnixStream::pair()?;
    tcp.set_read_timeout(None)?;
    tcp.set_write_timeout(Some(stall))?;
    let conn = Arc::new(Mutex::new(conn));
    let ends = (tcp.try_clone()?, inner.try_clone()?);
    let (c, (tcp_in, app_in)) = (Arc::clone(&conn), ends);
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .stack_size(RELAY_STACK)
            .spawn(f)
    };
    spawn(
        "oncilla-tls-in",
        Box::new(move || inbound(&c, tcp_in, app_in)),
    )?;
    let out_tcp = tcp.try_clone();
    let started = out_tcp.and_then(|t| {
        spawn(
            "oncilla-tls-out",
            Box::new(move || outbound(&conn, inner, t, stall)),
        )
    });
    if let Err(e) = started {
        // The inbound thread wakes up and ends.
        let _ = tcp.shutdown(Shutdown::Both);
        return Err(e);
    }
    Ok(DataStream::Tls(app))
}

/// Runs the handshake to its end, every read and write by `until` (one
/// socket call per step, each with what is left of the time), and sends
/// whatever it leaves queued.
fn handshake(conn: &mut rustls::Connection, tcp: &mut TcpStream, until: Instant) -> io::Result<()> {
    let left = |tcp: &TcpStream| -> io::Result<()> {
        let left = until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?;
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))
    };
    loop {
        while conn.wants_write() {
            left(tcp)?;
            conn.write_tls(tcp)?;
        }
        if !conn.is_handshaking() {
            return Ok(());
        }
        left(tcp)?;
        if conn.read_tls(tcp)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed during the TLS handshake",
            ));
        }
        if let Err(e) = conn.process_new_packets() {
            // Tell the peer why (the alert rustls queued), best effort.
            let _ = left(tcp).and_then(|()| conn.write_tls(tcp));
            return Err(invalid(e));
        }
    }
}

fn lock(conn: &Mutex<rustls::Connection>) -> io::Result<MutexGuard<'_, rustls::Connection>> {
    conn.lock()
        .map_err(|_| io::Error::other("TLS session state lost to a panic"))
}

/// Peer → protocol: decrypts what arrives and hands it on; at the peer's
/// end of stream (or its `close_notify`) the protocol reads end of stream.
fn inbound(conn: &Mutex<rustls::Connection>, mut tcp: TcpStream, app: UnixStream) {
    let mut wire = vec![0u8; PIECE];
    let mut plain = Vec::with_capacity(PIECE);
    // The first round hands on what the handshake already brought in.
    let mut n = 0;
    let ended = loop {
        plain.clear();
        let closed = match decrypt(conn, &wire[..n], &mut plain) {
            Ok(c) => c,
            Err(e) => break Err(e),
        };
        if !plain.is_empty() {
            if let Err(e) = sock::send(&app, &plain, &[]) {
                break Err(e);
            }
        }
        if closed {
            break Ok(());
        }
        n = match tcp.read(&mut wire) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => break Err(e),
        };
    };
    match ended {
        Ok(()) => {
            let _ = app.shutdown(Shutdown::Write);
        }
        Err(e) => {
            tracing::debug!(error = %e, "TLS tunnel in ended");
            let _ = app.shutdown(Shutdown::Both);
            let _ = tcp.shutdown(Shutdown::Both);
        }
    }
}

/// Feeds `bytes` to the session and appends the plaintext it has to
/// `plain` (with no bytes: what it already holds, such as data that came
/// in with the peer's last handshake message); true when the peer has
/// closed its side.
fn decrypt(
    conn: &Mutex<rustls::Connection>,
    mut bytes: &[u8],
    plain: &mut Vec<u8>,
) -> io::Result<bool> {
    let mut c = lock(conn)?;
    loop {
        let state = c.process_new_packets().map_err(invalid)?;
        let ready = state.plaintext_bytes_to_read();
        if ready > 0 {
            let at = plain.len();
            plain.resize(at + ready, 0);
            c.reader().read_exact(&mut plain[at..])?;
        }
        if state.peer_has_closed() {
            return Ok(true);
        }
        if bytes.is_empty() {
            return Ok(false);
        }
        if c.read_tls(&mut bytes)? == 0 {
            return Err(io::Error::other("TLS session takes no more bytes"));
        }
    }
}

/// Protocol → peer: encrypts what the protocol writes and sends it; when
/// the protocol closes its end, says `close_notify` and ends the stream.
fn outbound(
    conn: &Mutex<rustls::Connection>,
    mut app: UnixStream,
    tcp: TcpStream,
    stall: Duration,
) {
    let mut plain = vec![0u8; PIECE];
    let mut wire = Vec::with_capacity(PIECE + PIECE / 8);
    let ended: io::Result<()> = loop {
        let n = match app.read(&mut plain) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(e),
        };
        wire.clear();
        if let Err(e) = encrypt(conn, &plain[..n], &mut wire) {
            break Err(e);
        }
        if let Err(e) = send(&tcp, &wire, stall) {
            break Err(e);
        }
    };
    if let Err(e) = &ended {
        tracing::debug!(error = %e, "TLS tunnel out ended");
    } else if let Ok(mut c) = lock(conn) {
        c.send_close_notify();
        wire.clear();
        let queued = c.write_tls(&mut wire);
        drop(c);
        if queued.is_ok() {
            let _ = send(&tcp, &wire, stall);
        }
    }
    let _ = tcp.shutdown(Shutdown::Both);
    let _ = app.shutdown(Shutdown::Both);
}

/// Encrypts `plain` into TLS records appended to `wire`.
fn encrypt(
    conn: &Mutex<rustls::Connection>,
    mut plain: &[u8],
    wire: &mut Vec<u8>,
) -> io::Result<()> {
    let mut c = lock(conn)?;
    while !plain.is_empty() {
        let n = c.writer().write(plain)?;
        plain = &plain[n..];
        while c.wants_write() {
            c.write_tls(wire)?;
        }
    }
    Ok(())
}

/// Sends one relayed piece, all of it within the stall time plus its
/// length at [`sock::MIN_RATE`].
fn send(tcp: &TcpStream, wire: &[u8], stall: Duration) -> io::Result<()> {
    sock::send_by(
        tcp,
        wire,
        &[],
        sock::Deadline::for_transfer(wire.len(), stall),
    )
}
