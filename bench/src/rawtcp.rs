//! The raw TCP baseline for `ocmctl bench copy`: the same request/response
//! shape as Oncilla's data protocol with everything but the bytes taken
//! out (no handshake, no allocation lookup, no key, no bounds, no pool),
//! so the benchmark can put "what the path itself carries" beside every
//! Oncilla figure, over the same number of connections, in the same run.
//!
//! ```text
//! request (client) : op u8 (1 read, 2 write) | 7 reserved | len u64   (16 bytes)
//!                    a write is followed by `len` payload bytes
//! reply   (server) : a read: `len` bytes; a write: 8 bytes (the length)
//! ```
//!
//! It serves benchmarks only: the server holds no data and checks nothing
//! but the header, and never runs inside a daemon. It moves bytes as a
//! plain program does (`read_exact` and `write_all` on the stream), not
//! through Oncilla's receive path, so what that path does better (its
//! low-water mark, `oncilla_net::wire::lowat`) shows against it. Its
//! buffer is a plain heap buffer, or (`ServerMemory::Slab`) memory made
//! exactly as an agent makes a pool slab ([`crate::pages`]), to tell what
//! pool memory costs from what Oncilla's own code costs.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use oncilla_net::wire::sock;

use crate::pages::SharedPages;

use crate::BenchError;

const HEADER: usize = 16;
/// The server's buffer: reads are served from it, writes land in it.
const SERVER_BUF: usize = 4 << 20;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the server's writes land and its reads come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerMemory {
    /// A heap buffer (private anonymous 4 KiB pages): the plain program's.
    Anon,
    /// A pool slab as agents make them (memfd, shared, populated, locked,
    /// 4 KiB pages).
    Slab,
}

/// One connection's buffer.
enum Buffer {
    Heap(Vec<u8>),
    Slab(SharedPages),
}

impl Buffer {
    /// A buffer of `memory`, filled with the bytes reads serve.
    fn new(memory: ServerMemory) -> std::io::Result<Self> {
        let mut buffer = match memory {
            ServerMemory::Anon => Self::Heap(vec![0u8; SERVER_BUF]),
            ServerMemory::Slab => Self::Slab(
                SharedPages::new(SERVER_BUF)
                    .map_err(|e| std::io::Error::other(format!("cannot make a pool slab: {e}")))?,
            ),
        };
        buffer.bytes().fill(0x5A);
        Ok(buffer)
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Self::Heap(v) => v,
            Self::Slab(s) => s.bytes(),
        }
    }
}

/// Serves raw requests on `listener` until it fails, a thread per
/// connection, each with a buffer of `memory`.
pub fn serve(listener: TcpListener, memory: ServerMemory) {
    for stream in listener.incoming().flatten() {
        let spawned = std::thread::Builder::new()
            .name("raw-tcp".into())
            .spawn(move || {
                // A connection that breaks only ends that client's run,
                // which reports it.
                let _ = serve_one(stream, memory);
            });
        if let Err(e) = spawned {
            eprintln!("raw TCP baseline: cannot start a connection thread: {e}");
        }
    }
}

/// Starts a server on a free loopback port in this process; returns its address.
///
/// # Errors
/// The port cannot be bound.
pub fn spawn_local(memory: ServerMemory) -> Result<String, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::Failed(format!("raw TCP baseline: cannot bind: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::Failed(format!("raw TCP baseline: {e}")))?
        .to_string();
    std::thread::Builder::new()
        .name("raw-tcp-accept".into())
        .spawn(move || serve(listener, memory))
        .map_err(|e| BenchError::Failed(format!("raw TCP baseline: cannot start: {e}")))?;
    Ok(addr)
}

fn serve_one(mut stream: TcpStream, memory: ServerMemory) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buffer = Buffer::new(memory)?;
    let buf = buffer.bytes();
    loop {
        let mut head = [0u8; HEADER];
        match stream.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&head[8..16]);
        let len = u64::from_le_bytes(len);
        let mut left = usize::try_from(len).unwrap_or(usize::MAX);
        match head[0] {
            OP_READ => {
                while left > 0 {
                    let n = left.min(buf.len());
                    stream.write_all(&buf[..n])?;
                    left -= n;
                }
            }
            OP_WRITE => {
                while left > 0 {
                    let n = left.min(buf.len());
                    stream.read_exact(&mut buf[..n])?;
                    left -= n;
                }
                stream.write_all(&len.to_le_bytes())?;
            }
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unknown raw op {other}"),
                ))
            }
        }
    }
}

/// Connections to a raw server, one per stream.
pub struct RawClient {
    conns: Vec<TcpStream>,
}

impl RawClient {
    /// Opens `streams` connections to `addr`.
    ///
    /// # Errors
    /// The server cannot be reached.
    pub fn connect(addr: &str, streams: usize) -> Result<Self, BenchError> {
        let fail = |e: std::io::Error| {
            BenchError::Failed(format!(
                "raw TCP baseline at {addr}: {e} (start one with `ocmctl bench raw-server`)"
            ))
        };
        let sockaddr = addr
            .to_socket_addrs()
            .map_err(fail)?
            .next()
            .ok_or_else(|| {
                BenchError::Failed(format!("raw TCP baseline: {addr} resolves to nothing"))
            })?;
        let mut conns = Vec::with_capacity(streams);
        for _ in 0..streams.max(1) {
            let s = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT).map_err(fail)?;
            s.set_nodelay(true).map_err(fail)?;
            s.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
            s.set_write_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
            conns.push(s);
        }
        Ok(Self { conns })
    }

    /// Reads `dst.len()` bytes, split evenly over the connections (in
    /// parallel when there are several).
    ///
    /// # Errors
    /// I/O errors.
    pub fn read(&mut self, dst: &mut [u8]) -> Result<(), BenchError> {
        let per = dst.len().div_ceil(self.conns.len()).max(1);
        let parts: Vec<_> = dst.chunks_mut(per).zip(self.conns.iter_mut()).collect();
        run_parts(parts, |(part, conn)| {
            let head = header(OP_READ, part.len());
            conn.write_all(&head)?;
            conn.read_exact(part)
        })
    }

    /// Writes `src`, split evenly over the connections, and waits for every
    /// acknowledgement.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write(&mut self, src: &[u8]) -> Result<(), BenchError> {
        let per = src.len().div_ceil(self.conns.len()).max(1);
        let parts: Vec<_> = src.chunks(per).zip(self.conns.iter_mut()).collect();
        run_parts(parts, |(part, conn)| {
            let head = header(OP_WRITE, part.len());
            sock::send(&*conn, &head, part)?;
            let mut ack = [0u8; 8];
            conn.read_exact(&mut ack)
        })
    }
}

fn header(op: u8, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = op;
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// Runs `f` on every part: on this thread when there is one, else one
/// thread each.
fn run_parts<P: Send>(
    parts: Vec<P>,
    f: impl Fn(P) -> std::io::Result<()> + Sync,
) -> Result<(), BenchError> {
    let fail = |e: std::io::Error| BenchError::Failed(format!("raw TCP baseline: {e}"));
    if parts.len() == 1 {
        return parts.into_iter().try_for_each(&f).map_err(fail);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = parts.into_iter().map(|p| s.spawn(|| f(p))).collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("raw thread panicked")))
                .map_err(fail)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_round_trip_over_several_connections() {
        for (memory, streams) in [
            (ServerMemory::Anon, 1),
            (ServerMemory::Anon, 3),
            (ServerMemory::Slab, 3),
        ] {
            let addr = spawn_local(memory).unwrap();
            let mut c = RawClient::connect(&addr, streams).unwrap();
            let mut dst = vec![0u8; (5 << 20) + 3];
            c.read(&mut dst).unwrap();
            assert!(dst.iter().all(|&b| b == 0x5A));
            c.write(&dst).unwrap();
            let mut small = [0u8; 8];
            c.read(&mut small).unwrap();
        }
    }
}
