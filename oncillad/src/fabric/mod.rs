//! Data-path servers: how clients reach the pool's bytes. The checks every
//! server applies — the token handshake and a request's allocation, access
//! key and bounds — live here once, so each fabric serves only its transfer.

pub mod device;
pub mod flight;
pub mod pace;
pub mod pull;
pub mod replicate;
pub mod shm;
pub mod tcp;
pub mod verbs;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncilla_net::credential::{Keyring, Principal};
use oncilla_net::wire::{self, Request, Status, Welcome};

use crate::listen::ended::{Ended, Registered};
use crate::memory::held::{Held, HeldTable};
use crate::metrics::data::HelloRefusal;

/// Who may open a data or map connection here: the secrets hellos are
/// checked with, and this node's ended sessions (refused at once).
#[derive(Clone)]
pub struct Admission {
    pub keys: Keyring,
    pub ended: Arc<Ended>,
}

/// The user a principal acts for: a session's (from its id; one the
/// kernel did not name counts as one user, [`u32::MAX`], never as an
/// operator), none for a member.
pub(crate) fn user_of(who: &Principal) -> Option<u32> {
    match who {
        Principal::Session(id) => Some(oncilla_model::alloc::session_user(id).unwrap_or(u32::MAX)),
        _ => None,
    }
}

/// Reads a client's hello and answers it, all of it by `until` (a whole
/// handshake deadline: a peer that drips bytes is cut when it passes, not
/// when one read waits too long). The token is checked first, so a peer
/// without it learns nothing but the refusal (not even the version spoken
/// here); then the version; then `room`, given the secret the client
/// presented (a pull presents it again to the agent it reads from) and
/// who it is, takes the connection's place among authenticated ones or
/// says why there is none. A session's connection is refused once the
/// session ended here, and is registered to be shut when it ends (the
/// [`Registered`] comes back beside the place). `heard` is called as soon
/// as the whole hello is in (the connection has spoken: see
/// [`crate::listen::Ticket::heard`]). `Ok(Some(place))` when
/// the client may go on; `Ok(None)` when it was refused (and told why).
///
/// # Errors
/// Malformed or failed I/O; `TimedOut` past the deadline.
pub(crate) fn accept<S: Timed + std::os::fd::AsFd, P>(
    stream: &mut S,
    admission: &Admission,
    until: Instant,
    heard: impl FnOnce(),
    room: impl FnOnce(&[u8], &Principal) -> Result<P, &'static str>,
    refused: impl FnOnce(HelloRefusal),
) -> Result<Option<(P, Option<Registered>)>, wire::WireError> {
    let fd = stream.as_fd().try_clone_to_owned()?;
    let mut stream = Within { stream, until };
    let (version, presented) = wire::read_hello(&mut stream)?;
    heard();
    // The cluster token (operators, the master) or an application session's
    // credential; either way the requests still need each allocation's key.
    let who = match admission.keys.authenticate(&presented) {
        Some(who @ (Principal::Member | Principal::Session(_))) => who,
        _ => {
            tracing::warn!("data connection with wrong token");
            refused(HelloRefusal::WrongToken);
            wire::write_welcome(
                &mut stream,
                Welcome::Denied,
                "permission denied: wrong cluster token",
            )?;
            return Ok(None);
        }
    };
    if version != wire::VERSION {
        let msg = format!(
            "data protocol version {version} not supported (this agent speaks {})",
            wire::VERSION
        );
        refused(HelloRefusal::BadVersion);
        wire::write_welcome(&mut stream, Welcome::BadVersion, &msg)?;
        return Ok(None);
    }
    let registered = match &who {
        Principal::Session(id) => match admission.ended.admit(id, &fd) {
            Ok(r) => Some(r),
            Err(why) => {
                refused(HelloRefusal::WrongToken);
                wire::write_welcome(&mut stream, Welcome::Denied, why)?;
                return Ok(None);
            }
        },
        _ => None,
    };
    match room(&presented, &who) {
        Ok(place) => {
            wire::write_welcome(&mut stream, Welcome::Ok, "")?;
            Ok(Some((place, registered)))
        }
        Err(why) => {
            refused(HelloRefusal::NoSeat);
            wire::write_welcome(&mut stream, Welcome::Busy, why)?;
            Ok(None)
        }
    }
}

/// A blocking socket whose reads and writes can be given timeouts.
pub(crate) trait Timed: Read + Write {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
}

impl Timed for oncilla_net::tls::DataStream {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
}

impl Timed for UnixStream {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
}

/// A socket whose every read and write must finish by `until`: each call
/// gets what is left of the time as its timeout, and none starts after it.
/// For handshakes and other rare exchanges (two `setsockopt` per call),
/// never for the data path.
pub(crate) struct Within<'a, S> {
    pub stream: &'a mut S,
    pub until: Instant,
}

impl<S> Within<'_, S> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
        } else {
            Ok(left)
        }
    }
}

/// A socket timeout shows as `WouldBlock`; say what it is.
fn late(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
    } else {
        e
    }
}

impl<S: Timed> Read for Within<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read_timeout(Some(self.left()?))?;
        self.stream.read(buf).map_err(late)
    }
}

impl<S: Timed> Write for Within<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write_timeout(Some(self.left()?))?;
        self.stream.write(buf).map_err(late)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A request that passed every check: the allocation's entry (held for the
/// duration of the transfer, so its memory cannot be recycled under it),
/// the index of the extent that holds the whole range, and the offset of the
/// range inside that extent.
pub(crate) struct Authorized {
    pub held: Arc<Held>,
    pub extent: usize,
    pub at: u64,
}

/// Checks that `req` names an allocation held here, with its access key,
/// and a range inside one extent; otherwise the status and message to send.
pub(crate) fn authorize(table: &HeldTable, req: &Request) -> Result<Authorized, (Status, String)> {
    let Some(held) = table.get(&req.alloc_id).map(|e| Arc::clone(e.value())) else {
        return Err((Status::NoSuchAllocation, table.not_held(req.alloc_id)));
    };
    if !held.key_matches(&req.key) {
        // Answered exactly as an id held nowhere, so no one without the key
        // can tell which ids exist here.
        return Err((Status::NoSuchAllocation, table.not_held(req.alloc_id)));
    }
    match held.extent_for(req.offset, req.len) {
        Some(i) => {
            let at = req.offset - held.extents[i].alloc_offset;
            Ok(Authorized {
                held,
                extent: i,
                at,
            })
        }
        None => Err((
            Status::OutOfBounds,
            format!(
                "out of bounds: bytes {}..{} of allocation {} are not held by this node",
                req.offset,
                req.offset.saturating_add(req.len),
                req.alloc_id
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncilla_net::auth::Token;
    use oncilla_net::credential::{Credential, NodeKeys};

    fn token() -> Token {
        Token::new("0123456789abcdef0123456789abcdef").unwrap()
    }

    /// What an agent checks hellos with.
    fn keys() -> Admission {
        Admission {
            keys: Keyring::Node(std::sync::Arc::new(NodeKeys::derive(&token(), "n1"))),
            ended: Ended::new(Duration::from_secs(60)),
        }
    }

    fn hello(version: u16, tok: &[u8]) -> Vec<u8> {
        let mut b = wire::MAGIC.to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&u16::try_from(tok.len()).unwrap().to_le_bytes());
        b.extend_from_slice(tok);
        b
    }

    /// What [`accept`] gives for a test's hello.
    type Accepted = Result<Option<((), Option<Registered>)>, wire::WireError>;

    fn answer(bytes: &[u8]) -> (Accepted, Welcome, String) {
        let (mut server, mut client) = UnixStream::pair().unwrap();
        client.write_all(bytes).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let got = accept(
            &mut server,
            &keys(),
            until,
            || {},
            |_, _| Ok::<_, &str>(()),
            |_| {},
        );
        let (code, msg) = wire::read_welcome(&mut client).unwrap();
        (got, code, msg)
    }

    #[test]
    fn the_token_is_checked_before_anything_else_is_said() {
        // A wrong version with a wrong token learns only the refusal.
        let (got, code, msg) = answer(&hello(99, b"wrong"));
        assert!(matches!(got, Ok(None)));
        assert_eq!(code, Welcome::Denied);
        assert_eq!(msg, "permission denied: wrong cluster token");
        assert!(!msg.contains(&wire::VERSION.to_string()));
        // With the token, the version mismatch is explained.
        let (got, code, msg) = answer(&hello(99, token().as_bytes()));
        assert!(matches!(got, Ok(None)));
        assert_eq!(code, Welcome::BadVersion);
        assert!(msg.contains("version 99 not supported"), "{msg}");
        let (got, code, _) = answer(&hello(wire::VERSION, token().as_bytes()));
        assert!(matches!(got, Ok(Some(((), _)))));
        assert_eq!(code, Welcome::Ok);
        // A session's credential opens a data connection; a node's never
        // does (not even this node's: nodes copy nothing).
        let until = oncilla_net::credential::unix_now() + 60;
        let session = Credential::session(&token(), "n1-00ff00ff00ff00ff", until);
        let (got, code, _) = answer(&hello(wire::VERSION, session.as_bytes()));
        assert!(matches!(got, Ok(Some(((), _)))));
        assert_eq!(code, Welcome::Ok);
        for name in ["n1", "n2"] {
            let node = Credential::node(&token(), name);
            let (got, code, _) = answer(&hello(wire::VERSION, node.as_bytes()));
            assert!(matches!(got, Ok(None)));
            assert_eq!(code, Welcome::Denied);
        }
    }

    #[test]
    fn a_full_house_is_answered_busy_after_the_token() {
        let (mut server, mut client) = UnixStream::pair().unwrap();
        client
            .write_all(&hello(wire::VERSION, token().as_bytes()))
            .unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let got = accept(
            &mut server,
            &keys(),
            until,
            || {},
            |_, _| Err::<(), _>("too many data connections"),
            |_| {},
        );
        assert!(matches!(got, Ok(None)));
        let (code, msg) = wire::read_welcome(&mut client).unwrap();
        assert_eq!(
            (code, msg.as_str()),
            (Welcome::Busy, "too many data connections")
        );
    }

    #[test]
    fn the_whole_hello_has_one_deadline() {
        // A peer that sends part of its hello and then drips nothing more
        // is cut at the deadline, however the reads are split.
        let (mut server, mut client) = UnixStream::pair().unwrap();
        let bytes = hello(wire::VERSION, token().as_bytes());
        let dripper = std::thread::spawn(move || {
            for b in bytes.iter().take(6) {
                if client.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(Duration::from_secs(2));
        });
        let started = Instant::now();
        let until = started + Duration::from_millis(300);
        let got = accept(
            &mut server,
            &keys(),
            until,
            || {},
            |_, _| Ok::<_, &str>(()),
            |_| {},
        );
        let took = started.elapsed();
        assert!(
            matches!(&got, Err(wire::WireError::Io(e)) if e.kind() == io::ErrorKind::TimedOut),
            "{:?}",
            got.map(|p| p.is_some())
        );
        assert!(took < Duration::from_millis(1500), "cut after {took:?}");
        dripper.join().unwrap();
    }
}
