//! Fuzzing (proptest, a bounded number of cases) of everything that parses
//! bytes from a peer: the data handshake (hello, welcome), request and
//! reply headers, map grants, and presented credentials. Each decoder must
//! never panic on any input, and whatever it accepts must encode back to
//! the same bytes (reserved bytes, which decoders ignore, as zero).

#![allow(clippy::unwrap_used)]

use oncilla_net::auth::{Token, MAX_TOKEN_LEN};
use oncilla_net::credential::{Credential, Keyring, NodeKeys, Principal};
use oncilla_net::wire::{self, MapFile, MapGrant, Reply, Request, Welcome, WireError};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2048,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any 48 bytes: a request header is accepted exactly when its op is
    /// READ, WRITE, PULL or REPLICATE, and then re-encodes to the same bytes (the seven
    /// reserved bytes as zero).
    #[test]
    fn request_headers(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform16(any::<u8>())) {
        let mut b = [0u8; wire::REQUEST_LEN];
        b[..32].copy_from_slice(&bytes);
        b[32..].copy_from_slice(&tail);
        match Request::decode(&b) {
            Ok(r) => {
                prop_assert!((1..=4).contains(&b[0]));
                let mut canonical = b;
                canonical[1..8].fill(0);
                prop_assert_eq!(r.encode(), canonical);
                prop_assert_eq!(Request::decode(&r.encode()).unwrap(), r);
            }
            Err(WireError::BadOp(op)) => prop_assert!(op == b[0] && !(1..=4).contains(&op)),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Any bytes as a pull's source record: accepted exactly when the
    /// address is 1..=255 bytes of UTF-8, and then encodes back to the
    /// same bytes.
    #[test]
    fn pull_sources(head in prop::collection::vec(any::<u8>(), wire::SOURCE_LEN), addr in prop::collection::vec(any::<u8>(), 0..300)) {
        let head: [u8; wire::SOURCE_LEN] = head.try_into().unwrap();
        match wire::Source::decode_head(&head) {
            Ok((s, n)) => {
                prop_assert!((1..=wire::MAX_ADDR).contains(&n));
                let bytes = &addr[..n.min(addr.len())];
                if let Ok(s) = s.with_addr(bytes) {
                    let mut whole = head.to_vec();
                    whole.extend_from_slice(bytes);
                    if bytes.len() == n {
                        prop_assert_eq!(s.encode().unwrap(), whole);
                    }
                } else {
                    prop_assert!(std::str::from_utf8(bytes).is_err());
                }
            }
            Err(WireError::BadSource(_)) => {
                let n = u16::from_le_bytes([head[32], head[33]]) as usize;
                prop_assert!(n == 0 || n > wire::MAX_ADDR);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Any 16 bytes: a reply header is accepted exactly when its status is
    /// known, and then re-encodes to the same bytes (reserved as zero).
    #[test]
    fn reply_headers(b in prop::array::uniform16(any::<u8>())) {
        match Reply::decode(&b) {
            Ok(r) => {
                let mut canonical = b;
                canonical[4..8].fill(0);
                prop_assert_eq!(r.encode(), canonical);
            }
            Err(WireError::BadStatus(s)) => prop_assert!(s > 7),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Any 40 bytes are a grant and any 16 a file frame, and encode back
    /// to themselves.
    #[test]
    fn map_grants(v in prop::collection::vec(any::<u8>(), wire::GRANT_LEN + wire::MAP_FILE_LEN)) {
        let mut g = [0u8; wire::GRANT_LEN];
        g.copy_from_slice(&v[..wire::GRANT_LEN]);
        prop_assert_eq!(MapGrant::decode(&g).encode(), g);
        let mut f = [0u8; wire::MAP_FILE_LEN];
        f.copy_from_slice(&v[wire::GRANT_LEN..]);
        prop_assert_eq!(MapFile::decode(&f).encode(), f);
    }

    /// Any byte stream as a client hello: no panic; an accepted hello is
    /// the magic, a version and at most MAX_TOKEN_LEN token bytes, and
    /// writing it again gives the bytes read.
    #[test]
    fn hellos(bytes in prop::collection::vec(any::<u8>(), 0..64), magic in any::<bool>(), len in 0u16..2048) {
        // Half the cases start like a real hello so the length and token
        // paths are reached, not only the magic check.
        let mut stream = Vec::new();
        if magic {
            stream.extend_from_slice(&wire::MAGIC);
            stream.extend_from_slice(&wire::VERSION.to_le_bytes());
            stream.extend_from_slice(&len.to_le_bytes());
        }
        stream.extend_from_slice(&bytes);
        let mut r = stream.as_slice();
        match wire::read_hello(&mut r) {
            Ok((version, token)) => {
                prop_assert!(token.len() <= MAX_TOKEN_LEN);
                let consumed = stream.len() - r.len();
                let mut again = Vec::new();
                // Only the token goes through write_hello's own checks.
                again.extend_from_slice(&wire::MAGIC);
                again.extend_from_slice(&version.to_le_bytes());
                again.extend_from_slice(&u16::try_from(token.len()).unwrap().to_le_bytes());
                again.extend_from_slice(&token);
                prop_assert_eq!(&again[..], &stream[..consumed]);
                if version == wire::VERSION {
                    let mut written = Vec::new();
                    wire::write_hello(&mut written, &token).unwrap();
                    prop_assert_eq!(&written[..], &stream[..consumed]);
                }
            }
            Err(WireError::TokenTooLong) => prop_assert!(usize::from(len) > MAX_TOKEN_LEN || !magic),
            Err(WireError::BadMagic | WireError::Io(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Any byte stream as a server welcome: no panic; a known code with a
    /// UTF-8 message writes back to the bytes read.
    #[test]
    fn welcomes(code in 0u8..5, msg in ".{0,40}", junk in prop::collection::vec(any::<u8>(), 0..40)) {
        let mut stream = vec![code];
        let m = msg.as_bytes();
        stream.extend_from_slice(&u16::try_from(m.len()).unwrap().to_le_bytes());
        stream.extend_from_slice(m);
        let (w, text) = wire::read_welcome(&mut stream.as_slice()).unwrap();
        prop_assert_eq!(&text, &msg);
        if code <= 3 {
            let mut again = Vec::new();
            wire::write_welcome(&mut again, w, &text).unwrap();
            prop_assert_eq!(again, stream);
        } else {
            prop_assert_eq!(w, Welcome::Denied);
        }
        // Raw junk: no panic.
        let _ = wire::read_welcome(&mut junk.as_slice());
    }

    /// Presented secrets: arbitrary bytes are never taken for the token, a
    /// node or a session, by the master or by an agent; a credential the
    /// token made is recognised, and one bit flipped anywhere in it is not.
    #[test]
    fn credentials(junk in prop::collection::vec(any::<u8>(), 0..200), id in "[a-z0-9-]{1,40}", flip in any::<prop::sample::Index>()) {
        let token = Token::new("fuzz-token-0123456789").unwrap();
        let rings = [
            Keyring::Cluster(token.clone()),
            Keyring::Node(std::sync::Arc::new(NodeKeys::derive(&token, "n1"))),
        ];
        if let Ok(text) = std::str::from_utf8(&junk) {
            let _ = Credential::parse_session(text);
            let _ = NodeKeys::parse(text);
        }
        for ring in &rings {
            prop_assert!(ring.authenticate(&junk).is_none() || junk == token.as_bytes());
            for cred in [Credential::session(&token, &id, u64::MAX / 2), Credential::node(&token, &id)] {
                let expected = if cred.as_str().starts_with("node:") {
                    Principal::Node(id.clone())
                } else {
                    Principal::Session(id.clone())
                };
                let seen = ring.authenticate(cred.as_bytes());
                match (&ring, &expected) {
                    // Agents admit no node credential.
                    (Keyring::Node(_), Principal::Node(_)) => prop_assert_eq!(seen, None),
                    _ => prop_assert_eq!(seen, Some(expected.clone())),
                }
                let mut forged = cred.as_bytes().to_vec();
                let i = flip.index(forged.len());
                forged[i] ^= 1;
                let accepted = ring.authenticate(&forged);
                prop_assert!(accepted.is_none() || accepted != Some(expected));
            }
        }
        // `==` on credentials (constant time) agrees with the bytes.
        let cred = Credential::session(&token, &id, 7);
        prop_assert!(Credential::session(&token, &id, 7) == cred);
        let other = Credential::session(&token, &(id.clone() + "x"), 7);
        prop_assert!(other != cred);
    }
}
