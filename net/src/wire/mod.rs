//! The TCP data protocol, byte for byte.
//!
//! A connection starts with a handshake, then carries any number of
//! requests, answered strictly in order (so a client may pipeline).
//! All integers are little-endian.
//!
//! ```text
//! hello   (client) : "OCLD" | version u16 | token_len u16 | token
//! welcome (server) : code u8 (0 ok, 1 denied, 2 bad version) | msg_len u16 | msg
//! request (client) : op u8 | 7 reserved | alloc_id u64 | key [16] | offset u64 | len u64   (48 bytes)
//!                    a WRITE is followed by `len` payload bytes
//!                    a PULL is followed by a source record (below)
//! reply   (server) : status u32 | reserved u32 | len u64                                   (16 bytes)
//!                    followed by `len` bytes: the data of an ok READ, or a
//!                    UTF-8 message when status != 0
//! source  (client) : alloc_id u64 | key [16] | offset u64 | addr_len u16 | addr   (34 + addr_len bytes)
//! ```
//!
//! A PULL asks the agent to fill `len` bytes of its allocation from the
//! source: another allocation's bytes, held by the agent whose data port is
//! `addr`, which it reads itself (a third-party copy: the bytes never pass
//! through the client). Its ok reply carries no data.
//!
//! `offset` is relative to the start of the allocation; the agent checks it
//! against the extents it holds before touching memory. This module only
//! encodes and decodes; it never validates against state. [`sock`] moves
//! the encoded bytes through a socket.

pub mod dial;
pub mod lowat;
pub mod sock;

use std::io::{self, Read, Write};

/// Connection magic.
pub const MAGIC: [u8; 4] = *b"OCLD";
/// Protocol version spoken by this build.
pub const VERSION: u16 = 3;
/// Size of a request header.
pub const REQUEST_LEN: usize = 48;
/// Size of a reply header.
pub const REPLY_LEN: usize = 16;
/// Largest payload one request may move; larger copies are split.
pub const MAX_IO: u64 = 64 << 20;
/// Size of an access key.
pub const KEY_LEN: usize = 16;
/// Longest error message a reply may carry.
pub const MAX_MESSAGE: u64 = 4096;

/// Malformed bytes on a data connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not an Oncilla data connection (bad magic)")]
    BadMagic,
    #[error("unknown operation {0}")]
    BadOp(u8),
    #[error("unknown reply status {0}")]
    BadStatus(u32),
    #[error("token longer than {max} bytes", max = crate::auth::MAX_TOKEN_LEN)]
    TokenTooLong,
    #[error("bad pull source: {0}")]
    BadSource(&'static str),
    #[error("i/o on data connection: {0}")]
    Io(#[from] io::Error),
}

/// Handshake outcome sent by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Welcome {
    Ok = 0,
    Denied = 1,
    BadVersion = 2,
    /// The agent is at a bound for this caller (its share of connections):
    /// not a refusal of who it is. Retry later, give back what it holds,
    /// or go another way (a mapping's bytes are reached over TCP too).
    Busy = 3,
}

/// Writes the client hello.
///
/// # Errors
/// I/O errors; [`WireError::TokenTooLong`].
pub fn write_hello(w: &mut impl Write, token: &[u8]) -> Result<(), WireError> {
    let len = u16::try_from(token.len())
        .ok()
        .filter(|&l| usize::from(l) <= crate::auth::MAX_TOKEN_LEN)
        .ok_or(WireError::TokenTooLong)?;
    let mut buf = Vec::with_capacity(8 + token.len());
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&VERSION.to_le_bytes());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(token);
    w.write_all(&buf)?;
    Ok(())
}

/// Reads a client hello: the client's version and the token it presents.
///
/// # Errors
/// [`WireError::BadMagic`], [`WireError::TokenTooLong`], I/O errors.
pub fn read_hello(r: &mut impl Read) -> Result<(u16, Vec<u8>), WireError> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head)?;
    if head[..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    let len = usize::from(u16::from_le_bytes([head[6], head[7]]));
    if len > crate::auth::MAX_TOKEN_LEN {
        return Err(WireError::TokenTooLong);
    }
    let mut token = vec![0u8; len];
    r.read_exact(&mut token)?;
    Ok((version, token))
}

/// Writes the server's handshake answer.
///
/// # Errors
/// I/O errors.
pub fn write_welcome(w: &mut impl Write, code: Welcome, msg: &str) -> Result<(), WireError> {
    let msg = &msg.as_bytes()[..msg.len().min(usize::from(u16::MAX))];
    let mut buf = vec![code as u8];
    // Truncated to u16::MAX just above.
    #[allow(clippy::cast_possible_truncation)]
    buf.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    buf.extend_from_slice(msg);
    w.write_all(&buf)?;
    Ok(())
}

/// Reads the server's handshake answer.
///
/// # Errors
/// I/O errors; an unknown code is reported as [`Welcome::Denied`] with its number.
pub fn read_welcome(r: &mut impl Read) -> Result<(Welcome, String), WireError> {
    let mut head = [0u8; 3];
    r.read_exact(&mut head)?;
    let len = usize::from(u16::from_le_bytes([head[1], head[2]]));
    let mut msg = vec![0u8; len];
    r.read_exact(&mut msg)?;
    let msg = String::from_utf8_lossy(&msg).into_owned();
    let code = match head[0] {
        0 => Welcome::Ok,
        2 => Welcome::BadVersion,
        3 => Welcome::Busy,
        _ => Welcome::Denied,
    };
    Ok((code, msg))
}

/// Data operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Read = 1,
    Write = 2,
    /// Fill the range from a [`Source`] on another agent.
    Pull = 3,
    /// A primary's copy of a write to one of its replicas: a [`Stamp`]
    /// follows, then `len` payload bytes as for a WRITE. Only with the
    /// agents' replicator credential, and only into a replica's ranges,
    /// which it may span.
    Replicate = 4,
}

/// Size of a [`Stamp`].
pub const STAMP_LEN: usize = 16;

/// Who sent a REPLICATE and in which order: the primary agent's start
/// (its incarnation) and a number it raises for each copy it sends of one
/// allocation, so a replica never applies a copy older than one it
/// applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub sender: u64,
    pub seq: u64,
}

impl Stamp {
    /// Encodes it.
    pub fn encode(&self) -> [u8; STAMP_LEN] {
        let mut b = [0u8; STAMP_LEN];
        b[..8].copy_from_slice(&self.sender.to_le_bytes());
        b[8..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes one (any 16 bytes are a stamp).
    pub fn decode(b: &[u8; STAMP_LEN]) -> Self {
        Self {
            sender: le_u64(&b[..8]),
            seq: le_u64(&b[8..]),
        }
    }
}

impl Op {
    /// Whether `len` payload bytes follow the request.
    pub fn carries_payload(self) -> bool {
        matches!(self, Op::Write | Op::Replicate)
    }
}

/// Fixed part of a [`Source`] record.
pub const SOURCE_LEN: usize = 34;
/// Longest data-port address a [`Source`] may name.
pub const MAX_ADDR: usize = 255;

/// Where a PULL's bytes come from: bytes `[offset, offset + len)` (the
/// request's `len`) of allocation `alloc_id`, reached with `key` at the
/// data port `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub alloc_id: u64,
    pub key: [u8; KEY_LEN],
    pub offset: u64,
    pub addr: String,
}

impl Source {
    /// Encodes the record.
    ///
    /// # Errors
    /// [`WireError::BadSource`] for an address longer than [`MAX_ADDR`].
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let addr = self.addr.as_bytes();
        if addr.is_empty() || addr.len() > MAX_ADDR {
            return Err(WireError::BadSource("address empty or too long"));
        }
        let mut b = Vec::with_capacity(SOURCE_LEN + addr.len());
        b.extend_from_slice(&self.alloc_id.to_le_bytes());
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.offset.to_le_bytes());
        // At most MAX_ADDR, checked above.
        #[allow(clippy::cast_possible_truncation)]
        b.extend_from_slice(&(addr.len() as u16).to_le_bytes());
        b.extend_from_slice(addr);
        Ok(b)
    }

    /// Decodes the fixed part: the record less its address, and the
    /// address's length (checked against [`MAX_ADDR`]).
    ///
    /// # Errors
    /// [`WireError::BadSource`] for an empty or too long address.
    pub fn decode_head(b: &[u8; SOURCE_LEN]) -> Result<(Self, usize), WireError> {
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&b[8..24]);
        let addr_len = usize::from(u16::from_le_bytes([b[32], b[33]]));
        if addr_len == 0 || addr_len > MAX_ADDR {
            return Err(WireError::BadSource("address empty or too long"));
        }
        Ok((
            Self {
                alloc_id: le_u64(&b[0..8]),
                key,
                offset: le_u64(&b[24..32]),
                addr: String::new(),
            },
            addr_len,
        ))
    }

    /// Sets the address from its bytes.
    ///
    /// # Errors
    /// [`WireError::BadSource`] when they are not UTF-8.
    pub fn with_addr(mut self, addr: &[u8]) -> Result<Self, WireError> {
        self.addr = std::str::from_utf8(addr)
            .map_err(|_| WireError::BadSource("address is not UTF-8"))?
            .to_string();
        Ok(self)
    }
}

/// One data request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub alloc_id: u64,
    pub key: [u8; KEY_LEN],
    pub offset: u64,
    pub len: u64,
}

impl Request {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = self.op as u8;
        b[8..16].copy_from_slice(&self.alloc_id.to_le_bytes());
        b[16..32].copy_from_slice(&self.key);
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header.
    ///
    /// # Errors
    /// [`WireError::BadOp`] for an unknown operation.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, WireError> {
        let op = match b[0] {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Pull,
            4 => Op::Replicate,
            other => return Err(WireError::BadOp(other)),
        };
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&b[16..32]);
        Ok(Self {
            op,
            alloc_id: le_u64(&b[8..16]),
            key,
            offset: le_u64(&b[32..40]),
            len: le_u64(&b[40..48]),
        })
    }
}

/// Outcome of one data request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    NoSuchAllocation = 1,
    BadKey = 2,
    OutOfBounds = 3,
    TooLarge = 4,
    Internal = 5,
    /// The agent is at a bound for this caller (its share of something
    /// shared): retry later, or give back what it holds.
    Busy = 6,
    /// The range is a replica's: writes go to the allocation's primary
    /// (the caller's record is out of date).
    NotPrimary = 7,
}

/// One reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub len: u64,
}

impl Reply {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header.
    ///
    /// # Errors
    /// [`WireError::BadStatus`] for an unknown status.
    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Self, WireError> {
        let code = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let status = match code {
            0 => Status::Ok,
            1 => Status::NoSuchAllocation,
            2 => Status::BadKey,
            3 => Status::OutOfBounds,
            4 => Status::TooLarge,
            5 => Status::Internal,
            6 => Status::Busy,
            7 => Status::NotPrimary,
            other => return Err(WireError::BadStatus(other)),
        };
        Ok(Self {
            status,
            len: le_u64(&b[8..16]),
        })
    }
}

/// Size of a [`MapGrant`].
pub const GRANT_LEN: usize = 40;
/// Size of a [`MapFile`].
pub const MAP_FILE_LEN: usize = 16;

/// The body of an ok reply on the same-node map socket: the pool extent
/// that backs the requested allocation extent, and how many memory files
/// back it. The files follow, each as a [`MapFile`] frame with its memfd
/// attached (`SCM_RIGHTS`, one per frame), in order: their lengths add up
/// to `map_len`.
///
/// ```text
/// grant (server) : pool_offset u64 | map_len u64 | page u64 | at u64 | files u64   (40 bytes)
/// file  (server) : file_offset u64 | len u64 (+ its fd)                            (16 bytes each)
/// ```
///
/// `[pool_offset, pool_offset + map_len)` is the pool extent (whole pages,
/// all of it the allocation's; it names the extent, so striped extents
/// that share one are mapped once); `page` is the pool's page size, to
/// which every file offset, length and the mapping address must be aligned
/// (huge pages); the requested extent starts `at` bytes into it. A file
/// backs nothing but this pool extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapGrant {
    pub pool_offset: u64,
    pub map_len: u64,
    pub page: u64,
    pub at: u64,
    pub files: u64,
}

impl MapGrant {
    /// Encodes the grant.
    pub fn encode(&self) -> [u8; GRANT_LEN] {
        let mut b = [0u8; GRANT_LEN];
        b[0..8].copy_from_slice(&self.pool_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.map_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.page.to_le_bytes());
        b[24..32].copy_from_slice(&self.at.to_le_bytes());
        b[32..40].copy_from_slice(&self.files.to_le_bytes());
        b
    }

    /// Decodes a grant.
    pub fn decode(b: &[u8; GRANT_LEN]) -> Self {
        Self {
            pool_offset: le_u64(&b[0..8]),
            map_len: le_u64(&b[8..16]),
            page: le_u64(&b[16..24]),
            at: le_u64(&b[24..32]),
            files: le_u64(&b[32..40]),
        }
    }
}

/// One memory file of a [`MapGrant`]: `len` bytes of it from
/// `file_offset`, mapped next after the previous file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapFile {
    pub file_offset: u64,
    pub len: u64,
}

impl MapFile {
    pub fn encode(&self) -> [u8; MAP_FILE_LEN] {
        let mut b = [0u8; MAP_FILE_LEN];
        b[0..8].copy_from_slice(&self.file_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; MAP_FILE_LEN]) -> Self {
        Self {
            file_offset: le_u64(&b[0..8]),
            len: le_u64(&b[8..16]),
        }
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_roundtrip() {
        let g = MapGrant {
            pool_offset: 2 << 20,
            map_len: 4 << 20,
            page: 2 << 20,
            at: 4096,
            files: 3,
        };
        assert_eq!(MapGrant::decode(&g.encode()), g);
        let f = MapFile {
            file_offset: 8 << 20,
            len: 2 << 20,
        };
        assert_eq!(MapFile::decode(&f.encode()), f);
    }

    #[test]
    fn request_roundtrip() {
        let r = Request {
            op: Op::Write,
            alloc_id: 42,
            key: [7; KEY_LEN],
            offset: 1 << 40,
            len: 12345,
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let mut bad = r.encode();
        bad[0] = 9;
        assert!(matches!(Request::decode(&bad), Err(WireError::BadOp(9))));
    }

    #[test]
    fn source_roundtrip_and_refusals() {
        let s = Source {
            alloc_id: 7,
            key: [3; KEY_LEN],
            offset: 1 << 33,
            addr: "127.0.0.1:7001".into(),
        };
        let b = s.encode().unwrap();
        let (head, n) = Source::decode_head(b[..SOURCE_LEN].try_into().unwrap()).unwrap();
        assert_eq!(n, s.addr.len());
        assert_eq!(head.with_addr(&b[SOURCE_LEN..]).unwrap(), s);
        let long = Source {
            addr: "a".repeat(MAX_ADDR + 1),
            ..s.clone()
        };
        assert!(matches!(long.encode(), Err(WireError::BadSource(_))));
        let mut empty = b.clone();
        empty[32..34].copy_from_slice(&0u16.to_le_bytes());
        assert!(Source::decode_head(empty[..SOURCE_LEN].try_into().unwrap()).is_err());
        let (head, _) = Source::decode_head(b[..SOURCE_LEN].try_into().unwrap()).unwrap();
        assert!(head.with_addr(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn reply_roundtrip() {
        let r = Reply {
            status: Status::OutOfBounds,
            len: 99,
        };
        assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn handshake_roundtrip() {
        let mut buf = Vec::new();
        write_hello(&mut buf, b"tok").unwrap();
        let (v, t) = read_hello(&mut buf.as_slice()).unwrap();
        assert_eq!((v, t.as_slice()), (VERSION, &b"tok"[..]));
        let mut buf = Vec::new();
        write_welcome(&mut buf, Welcome::Denied, "permission denied").unwrap();
        let (code, msg) = read_welcome(&mut buf.as_slice()).unwrap();
        assert_eq!((code, msg.as_str()), (Welcome::Denied, "permission denied"));
        assert!(matches!(
            read_hello(&mut &b"HTTP/1.1 GET"[..]),
            Err(WireError::BadMagic)
        ));
    }

    #[test]
    fn decoders_never_panic_on_any_header() {
        // Every op byte and status word, with arbitrary surrounding bytes.
        for op in 0..=255u8 {
            let mut b = [0xA5u8; REQUEST_LEN];
            b[0] = op;
            let _ = Request::decode(&b);
        }
        for status in [0u32, 5, 6, u32::MAX] {
            let mut b = [0x5Au8; REPLY_LEN];
            b[..4].copy_from_slice(&status.to_le_bytes());
            let _ = Reply::decode(&b);
        }
    }
}
