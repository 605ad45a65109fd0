//! Same-node sharing: hands the memory files behind an extent to a local
//! application over a Unix socket (`SCM_RIGHTS`), so it can map an extent
//! it holds the access key for and use it as plain memory.
//!
//! The exchange reuses the data protocol's framing: hello/welcome with the
//! session credential, then one request per extent (`op` read, the
//! extent's allocation offset and length), each answered by a reply whose
//! body is a [`MapGrant`] (the pool extent behind it and where the extent
//! starts inside it), followed by one [`MapFile`] frame per memory file
//! behind that pool extent, its memfd attached. Those files back nothing
//! but that pool extent (see `pool::carve`), so a process that maps all of
//! each sees only the allocation it asked for. A refused request gets the
//! usual status and message and ends the connection.
//!
//! Limits: a connection that has not been granted an extent yet holds a
//! place in a small budget ([`MAX_MAP_PENDING`], oldest evicted first) and
//! must finish its hello and first request within [`REQUEST_DEADLINE`];
//! at most [`MAX_MAP_CONNECTIONS`] are served at once, so threads stay
//! bounded; accept errors back off. Each grant's files are charged to the
//! user before they are sent and the connection reads no further request
//! until its process took them ([`super::flight`]), so no user can fill
//! the kernel's bound on descriptors in flight, which is the agent's.
//!
//! The connection is the process's lease (see [`crate::memory::lease`]):
//! it is served on its own thread, the agent holds the granted extents
//! until the process closes it, and writes one byte on it when the
//! allocation is released; a file it keeps past that holds only zeros (the
//! refiller releases its pages). This module never maps memory itself and
//! never changes the held table.

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use oncilla_net::wire::{self, MapFile, MapGrant, Reply, Request, Status, GRANT_LEN, REQUEST_LEN};

use super::flight::{self, Flight};
use super::{Admission, Within};
use crate::listen::{AcceptBackoff, Pending, Place, Ticket, Users};
use crate::memory::held::{Held, HeldTable};
use crate::memory::lease::Leases;
use crate::metrics::data::Transfers;

/// Most map connections (leases, and connections on their way to one)
/// at once; each is served by its own thread.
pub const MAX_MAP_CONNECTIONS: usize = 1024;
/// Of those, most one user holds (a quarter): one tenant's leases never
/// leave the others without a map connection.
pub const MAX_MAP_CONNECTIONS_PER_USER: usize = MAX_MAP_CONNECTIONS / 4;
/// Most map connections not yet granted an extent, apart from
/// [`MAX_MAP_CONNECTIONS`]; a new one past it evicts the oldest (see
/// [`Pending`]).
pub const MAX_MAP_PENDING: usize = 64;
/// The hello and the first request, up to the first grant, must be done
/// within this; so must each later request once its first byte is in.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Most extents one connection may ask for.
const MAX_REQUESTS: usize = 1 << 16;

/// Serves mapping requests until the listener fails; each connection (a
/// lease) on its own thread, for as long as the process keeps it open.
pub fn serve(
    listener: UnixListener,
    held: HeldTable,
    leases: Arc<Leases>,
    admission: Admission,
    metrics: Arc<Transfers>,
) {
    let live = Arc::new(AtomicUsize::new(0));
    let users = Users::new(MAX_MAP_CONNECTIONS_PER_USER);
    let flight = Flight::new();
    let pending = Pending::new(MAX_MAP_PENDING, MAX_MAP_PENDING);
    let mut backoff = AcceptBackoff::new("map");
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        let ticket = match pending.admit(&stream, None) {
            Ok(t) => t,
            Err(e) => {
                drop(stream);
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        let (held, leases, admission) = (Arc::clone(&held), Arc::clone(&leases), admission.clone());
        let live = Arc::clone(&live);
        let users = Arc::clone(&users);
        let flight = Arc::clone(&flight);
        let metrics = Arc::clone(&metrics);
        let spawned = std::thread::Builder::new()
            .name("oncilla-lease".into())
            .spawn(move || {
                let mut lease = Lease {
                    leases,
                    registered: None,
                    holding: Vec::new(),
                };
                let served = serve_one(
                    stream,
                    &held,
                    &admission,
                    &mut lease,
                    ticket,
                    (&live, &users, &flight),
                    &metrics,
                );
                if let Err(e) = served {
                    tracing::debug!(error = %e, "map connection ended");
                }
            });
        match spawned {
            Ok(_) => backoff.ok(),
            Err(e) => std::thread::sleep(backoff.failed(&e)),
        }
    }
}

/// What one connection holds: its registration and the granted entries.
struct Lease {
    leases: Arc<Leases>,
    registered: Option<(u64, u64)>,
    /// Keeps the granted extents' memory out of the refiller.
    holding: Vec<Arc<Held>>,
}

impl Lease {
    /// Registers the connection as a lease on `alloc_id` (once), then
    /// passes `grant` on unless the allocation is moving (its node is
    /// being drained: it has a replica now, and every write must go
    /// through its agent). The move looks for leases under the lock that
    /// gives it the replica, so one of the two sees the other.
    fn hold_unless_moving<T>(
        &mut self,
        alloc_id: u64,
        stream: &UnixStream,
        held: &Held,
        grant: T,
    ) -> std::io::Result<Result<T, (Status, String)>> {
        let fresh = self.registered.is_none();
        if fresh {
            let id = self.leases.add(alloc_id, stream)?;
            self.registered = Some((alloc_id, id));
        }
        if held.copying.order().replicas.is_empty() {
            return Ok(Ok(grant));
        }
        if let Some((a, id)) = self.registered.filter(|_| fresh) {
            self.leases.remove(a, id);
            self.registered = None;
        }
        Ok(Err((
            Status::Busy,
            format!("allocation {alloc_id} is moving to another node (its node is drained): it is copied, not mapped, until it has moved"),
        )))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some((alloc_id, id)) = self.registered {
            self.leases.remove(alloc_id, id);
        }
    }
}

fn serve_one(
    mut stream: UnixStream,
    held: &HeldTable,
    admission: &Admission,
    lease: &mut Lease,
    ticket: Ticket,
    (live, users, flight): (&AtomicUsize, &Arc<Users>, &Arc<Flight>),
    metrics: &Transfers,
) -> Result<(), wire::WireError> {
    let until = Instant::now() + REQUEST_DEADLINE;
    let Some(((_place, user), _registered)) = super::accept(
        &mut stream,
        admission,
        until,
        || ticket.heard(),
        |_, who| {
            let user = super::user_of(who);
            let share = users
                .share(user)
                .map_err(|_| "too many map connections from this user")?;
            Ok((
                (
                    Place::take(live, MAX_MAP_CONNECTIONS, "too many map connections")?,
                    share,
                ),
                user,
            ))
        },
        |_| {},
    )?
    else {
        return Ok(());
    };
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut ticket = Some(ticket);
    for _ in 0..MAX_REQUESTS {
        let mut head = [0u8; REQUEST_LEN];
        let got = if lease.registered.is_none() {
            // Before the first grant, everything by the one deadline.
            Within {
                stream: &mut stream,
                until,
            }
            .read_exact(&mut head)
        } else {
            next_request(&mut stream, &mut head)
        };
        match got {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let req = Request::decode(&head)?;
        let started = Instant::now();
        if lease.registered.is_some_and(|(id, _)| id != req.alloc_id) {
            let msg = "one allocation per map connection";
            let reply = Reply {
                status: Status::OutOfBounds,
                len: msg.len() as u64,
            };
            stream.write_all(&reply.encode())?;
            stream.write_all(msg.as_bytes())?;
            return Ok(());
        }
        let grant = match super::authorize(held, &req) {
            Ok(ok) => {
                let extent = &ok.held.extents[ok.extent];
                match extent.pool() {
                    None => Err((
                        Status::OutOfBounds,
                        "GPU memory cannot be mapped; it is copied over TCP".to_string(),
                    )),
                    Some(_) if ok.at != 0 || extent.len != req.len => {
                        Err((Status::OutOfBounds, "map whole extents only".to_string()))
                    }
                    // A copy being made here takes writes only from its
                    // primary's agent.
                    Some(_) if extent.copy != 0 => Err((
                        Status::NotPrimary,
                        format!(
                            "bytes {}..{} of allocation {} are a replica here: it is copied, not mapped",
                            req.offset,
                            req.offset.saturating_add(req.len),
                            req.alloc_id
                        ),
                    )),
                    Some(m) => match m.files() {
                        None => Err((
                            Status::OutOfBounds,
                            format!(
                                "allocation {} belongs to a session of another node: \
                                 only memory on its session's node is mapped; it is copied",
                                req.alloc_id
                            ),
                        )),
                        Some(files) => match flight.charge(user, files.len()) {
                            Err(msg) => Err((Status::Busy, msg)),
                            Ok(charge) => Ok((
                                charge,
                                files.to_vec(),
                                MapGrant {
                                    pool_offset: m.offset(),
                                    map_len: m.len(),
                                    page: m.page_size(),
                                    at: extent.at,
                                    files: files.len() as u64,
                                },
                                ok,
                            )),
                        },
                    },
                }
            }
            Err(refused) => Err(refused),
        };
        let grant = match grant {
            Ok(g) => {
                let held = Arc::clone(&g.3.held);
                lease.hold_unless_moving(req.alloc_id, &stream, &held, g)?
            }
            Err(refused) => Err(refused),
        };
        match grant {
            Ok((charge, files, grant, ok)) => {
                // From here the connection lives as long as the mapping,
                // outside the budget for newcomers.
                drop(ticket.take());
                lease.holding.push(ok.held);
                let reply = Reply {
                    status: Status::Ok,
                    len: GRANT_LEN as u64,
                }
                .encode();
                let mut head = reply.to_vec();
                head.extend_from_slice(&grant.encode());
                metrics
                    .map
                    .served(usize::try_from(req.len).unwrap_or(usize::MAX));
                let sent = stream.write_all(&head).and_then(|()| {
                    files.iter().try_for_each(|part| {
                        // From here the file is never reused for anything else.
                        part.file.share();
                        let frame = MapFile {
                            file_offset: part.file_off,
                            len: part.len,
                        }
                        .encode();
                        send_with_fd(&mut stream, &frame, part.file.fd().as_raw_fd())
                    })
                });
                // Whatever was sent stays charged until the process took it
                // or went away, even when sending failed part way (a peer
                // that stopped reading): no further request meanwhile.
                let taken = flight::wait_taken(&stream);
                drop(charge);
                sent?;
                taken?;
                metrics.map.took(started.elapsed());
            }
            Err((status, msg)) => {
                let reply = Reply {
                    status,
                    len: msg.len() as u64,
                }
                .encode();
                stream.write_all(&reply)?;
                stream.write_all(msg.as_bytes())?;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sends `bytes` with `fd` attached to the first of them.
fn send_with_fd(stream: &mut UnixStream, bytes: &[u8], fd: RawFd) -> std::io::Result<()> {
    let fds = [fd];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(bytes)];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    // The fd went with the first byte; finish the bytes.
    stream.write_all(&bytes[sent..])
}

/// A lease's next request: it may be long in coming (the connection lives
/// as long as the mapping), but once its first byte is in, the rest must
/// follow within [`REQUEST_DEADLINE`].
fn next_request(stream: &mut UnixStream, head: &mut [u8; REQUEST_LEN]) -> std::io::Result<()> {
    stream.set_read_timeout(None)?;
    if stream.read(&mut head[..1])? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Within {
        stream,
        until: Instant::now() + REQUEST_DEADLINE,
    }
    .read_exact(&mut head[1..])
}
