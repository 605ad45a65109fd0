//! Who a caller is: an operator (the master too) holding the cluster
//! token; one node, holding the credential derived from the token for its
//! name; or one application session, holding the credential its local
//! agent issued when the session opened.
//!
//! Every secret below the token is an HMAC-SHA256 derived from it, so
//! nobody needs to ask anyone to check one:
//! - a *node credential* (`node:<name>:<mac>`) is presented by that node's
//!   agent to the master, and by the master to that agent; it proves the
//!   name, and nothing else;
//! - a node's agent holds [`NodeKeys`]: its node credential, the *session
//!   key* every agent shares (it makes and checks session credentials,
//!   `session:<id>:<expiry>:<mac>`, good until `expiry`, Unix seconds,
//!   give or take [`CLOCK_SKEW`]: the agent sends its session a fresh one
//!   well before, so a credential stops working at most its lifetime
//!   after the session ends), and a *verifier* of the token (a hash: it
//!   checks an operator's token but cannot present one). An agent never
//!   needs the token itself, so a node's secrets make it neither an
//!   operator nor another node;
//! - applications never hold more than their session's credential, which
//!   opens nothing but that session's data-path connections and RDMA
//!   queue pairs (the allocations themselves still need their access
//!   keys).
//!
//! All travel the same way: as the bearer value of `authorization`
//! metadata and as the secret of a data-path hello. This module checks and
//! makes them (comparison in constant time); it never logs one.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

use crate::auth::{hex, Token, AUTH_METADATA};
use oncilla_model::secret::ct_eq;

/// How a session credential starts (a token never does: see
/// [`Keyring::authenticate`]).
const SESSION_PREFIX: &str = "session:";
/// How a node credential starts.
const NODE_PREFIX: &str = "node:";
/// How a node key file starts.
const KEYS_HEADER: &str = "oncilla-node-keys-v1";
/// Longest session id or node name a credential may name.
const MAX_SESSION_ID: usize = 128;
/// Bytes of the MAC.
const MAC_LEN: usize = 32;
/// How far apart nodes' clocks may be for a session credential's expiry:
/// one made on one node is good on another this much past its expiry.
pub const CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(30);

/// Seconds since the Unix epoch now (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long past its credential's expiry (and the skew) a data connection
/// opened with it may still serve requests: one that sits idle after the
/// expiry is closed at once, this bounds one that never does (a copy in
/// flight is not cut unless it lasts this long). liboncilla stops reusing
/// a pooled connection once its credential expired.
pub const CONNECTION_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// The expiry (Unix seconds) a session credential names; `None` for
/// anything else. Checks no MAC: for a credential already authenticated.
pub fn session_expiry(presented: &[u8]) -> Option<u64> {
    parse_session(presented).map(|(_, expires, _)| expires)
}

/// Whether a session credential that expires at `expires` (Unix seconds)
/// is still good.
fn fresh(expires: u64) -> bool {
    expires.saturating_add(CLOCK_SKEW.as_secs()) >= unix_now()
}

/// Who presented a valid secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// An operator or the master: holds the cluster token.
    Member,
    /// A node, by name: its agent, or (to that agent) the master.
    Node(String),
    /// An application session, by id.
    Session(String),
}

/// What a caller presents: the cluster token or a session credential, in
/// the text form both take on the wire. `Debug` never shows it; `==`
/// takes time that depends only on the lengths.
#[derive(Clone)]
pub struct Credential(std::sync::Arc<str>);

impl PartialEq for Credential {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(self.0.as_bytes(), other.0.as_bytes())
    }
}

impl Eq for Credential {}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

impl Credential {
    /// A cluster member's: the token itself.
    pub fn member(token: &Token) -> Self {
        Self(token.as_str().into())
    }

    /// The credential of node `name` under `token`.
    pub fn node(token: &Token, name: &str) -> Self {
        Self(format!("{NODE_PREFIX}{name}:{}", hex(&node_mac(token, name))).into())
    }

    /// The credential of session `session_id`, good until `expires` (Unix
    /// seconds), as an agent of the cluster of `token` issues it.
    pub fn session(token: &Token, session_id: &str, expires: u64) -> Self {
        session_credential(&session_key(token), session_id, expires)
    }

    /// A credential received in text form (from the agent), checked for
    /// shape only.
    ///
    /// # Errors
    /// Text that is not a session credential.
    pub fn parse_session(text: &str) -> Result<Self, &'static str> {
        if parse_session(text.as_bytes()).is_none() {
            return Err("not an Oncilla session credential");
        }
        Ok(Self(text.into()))
    }

    /// The session a session credential names (`None` for any other).
    pub fn session_id(&self) -> Option<&str> {
        parse_session(self.0.as_bytes()).map(|(id, _, _)| id)
    }

    /// The text form (bearer value, hello secret).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The session id of the credential agents present to each other to copy
/// a replicated allocation's writes (REPLICATE requests): minted with the
/// session key every agent holds, and never the id of an application's
/// session (those end in `-u<uid>-` and 16 hex digits).
pub const REPLICATOR: &str = "@replicator";

/// What an agent holds instead of the cluster token: its node's name and
/// credential, the session key, and a verifier of the token. Made from the
/// token by [`NodeKeys::derive`] (`ocmctl node-keys` writes them to a file
/// for `oncillad --node-keys-file`). `Debug` shows only the name.
#[derive(Clone)]
pub struct NodeKeys {
    name: String,
    credential: Credential,
    sessions: [u8; MAC_LEN],
    verifier: [u8; MAC_LEN],
}

impl std::fmt::Debug for NodeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKeys({}, <redacted>)", self.name)
    }
}

/// Why a node key file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("{0}")]
    File(#[from] crate::auth::TokenError),
    #[error(
        "node key file {path}: {why}; make it again with `ocmctl node-keys NAME --out {path}`"
    )]
    Malformed { path: String, why: &'static str },
}

impl NodeKeys {
    /// Node `name`'s keys in the cluster of `token`.
    pub fn derive(token: &Token, name: &str) -> Self {
        Self {
            name: name.to_string(),
            credential: Credential::node(token, name),
            sessions: session_key(token),
            verifier: verifier(token.as_bytes()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What this node presents to the master.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// The credential of session `session_id` good until `expires` (Unix
    /// seconds), to give it at open and again before that.
    pub fn session(&self, session_id: &str, expires: u64) -> Credential {
        session_credential(&self.sessions, session_id, expires)
    }

    /// The keys as a key file holds them (one line).
    pub fn to_text(&self) -> String {
        format!(
            "{KEYS_HEADER} {} {} {}\n",
            self.credential.as_str(),
            hex(&self.sessions),
            hex(&self.verifier)
        )
    }

    /// Keys from a key file's text.
    ///
    /// # Errors
    /// What is wrong with the text (never quoting a secret).
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let mut words = text.split_whitespace();
        if words.next() != Some(KEYS_HEADER) {
            return Err("not an Oncilla node key file (first word should be oncilla-node-keys-v1)");
        }
        let (Some(cred), Some(sessions), Some(verifier), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err("expected a node credential, a session key and a verifier");
        };
        let (name, _) =
            parse_mac(NODE_PREFIX, cred.as_bytes()).ok_or("malformed node credential")?;
        Ok(Self {
            name: name.to_string(),
            credential: Credential(cred.into()),
            sessions: unhex(sessions).ok_or("malformed session key")?,
            verifier: unhex(verifier).ok_or("malformed verifier")?,
        })
    }

    /// Keys from a key file, which must be private (as a token file).
    ///
    /// # Errors
    /// [`KeysError`]: unreadable, shared with others, or malformed.
    pub fn load(path: &std::path::Path) -> Result<Self, KeysError> {
        let text = crate::auth::read_private(path)?;
        Self::parse(&text).map_err(|why| KeysError::Malformed {
            path: path.display().to_string(),
            why,
        })
    }

    /// Who `presented` is to this node's agent: [`Principal::Member`] for
    /// the token (checked against the verifier: the master, operators) or
    /// a [`Principal::Session`]; `None` otherwise. Node credentials are for
    /// the master only: an agent admits none, its own included. Constant
    /// time in the secret's bytes.
    pub fn authenticate(&self, presented: &[u8]) -> Option<Principal> {
        if presented.starts_with(NODE_PREFIX.as_bytes()) {
            return None;
        }
        if let Some((id, expires, claimed)) = parse_session(presented) {
            let ok = ct_eq(&session_mac(&self.sessions, id, expires), &claimed);
            return (ok && fresh(expires)).then(|| Principal::Session(id.to_string()));
        }
        ct_eq(&verifier(presented), &self.verifier).then_some(Principal::Member)
    }
}

/// The secrets a process checks callers with: the cluster token (the
/// master) or one node's keys (an agent).
#[derive(Clone, Debug)]
pub enum Keyring {
    Cluster(Token),
    Node(std::sync::Arc<NodeKeys>),
}

impl Keyring {
    /// Who `presented` belongs to; `None` when it is nobody's.
    pub fn authenticate(&self, presented: &[u8]) -> Option<Principal> {
        match self {
            Keyring::Node(keys) => keys.authenticate(presented),
            Keyring::Cluster(token) => {
                if let Some((name, claimed)) = parse_mac(NODE_PREFIX, presented) {
                    return ct_eq(&node_mac(token, name), &claimed)
                        .then(|| Principal::Node(name.to_string()));
                }
                if let Some((id, expires, claimed)) = parse_session(presented) {
                    let ok = ct_eq(&session_mac(&session_key(token), id, expires), &claimed);
                    return (ok && fresh(expires)).then(|| Principal::Session(id.to_string()));
                }
                token.matches(presented).then_some(Principal::Member)
            }
        }
    }
}

fn hmac(key: &[u8], label: &[u8], msg: &[u8]) -> [u8; MAC_LEN] {
    // A key of any length is accepted by HMAC: this cannot fail.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; MAC_LEN];
    };
    m.update(label);
    m.update(msg);
    m.finalize().into_bytes().into()
}

fn node_mac(token: &Token, name: &str) -> [u8; MAC_LEN] {
    hmac(
        token.as_bytes(),
        b"oncilla node credential\0",
        name.as_bytes(),
    )
}

fn session_key(token: &Token) -> [u8; MAC_LEN] {
    hmac(token.as_bytes(), b"oncilla session key\0", b"")
}

fn session_mac(key: &[u8; MAC_LEN], session_id: &str, expires: u64) -> [u8; MAC_LEN] {
    hmac(
        key,
        b"oncilla session credential v2\0",
        format!("{session_id}:{expires}").as_bytes(),
    )
}

fn session_credential(key: &[u8; MAC_LEN], session_id: &str, expires: u64) -> Credential {
    Credential(
        format!(
            "{SESSION_PREFIX}{session_id}:{expires}:{}",
            hex(&session_mac(key, session_id, expires))
        )
        .into(),
    )
}

/// `session:<id>:<expiry>:<64 hex digits>` as (id, expiry, mac).
fn parse_session(presented: &[u8]) -> Option<(&str, u64, [u8; MAC_LEN])> {
    let text = std::str::from_utf8(presented).ok()?;
    let rest = text.strip_prefix(SESSION_PREFIX)?;
    let (rest, digits) = rest.rsplit_once(':')?;
    let (id, expires) = rest.rsplit_once(':')?;
    if id.is_empty() || id.len() > MAX_SESSION_ID || expires.is_empty() || expires.len() > 20 {
        return None;
    }
    if !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id, expires.parse().ok()?, unhex(digits)?))
}

/// A one-way image of the token: checks a presented token, cannot be
/// presented as one.
fn verifier(token: &[u8]) -> [u8; MAC_LEN] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"oncilla token verifier\0");
    h.update(token);
    h.finalize().into()
}

/// `<prefix><name>:<64 hex digits>` as (name, mac).
fn parse_mac<'a>(prefix: &str, presented: &'a [u8]) -> Option<(&'a str, [u8; MAC_LEN])> {
    let text = std::str::from_utf8(presented).ok()?;
    let rest = text.strip_prefix(prefix)?;
    let (id, digits) = rest.rsplit_once(':')?;
    if id.is_empty() || id.len() > MAX_SESSION_ID {
        return None;
    }
    Some((id, unhex(digits)?))
}

fn unhex(digits: &str) -> Option<[u8; MAC_LEN]> {
    if digits.len() != 2 * MAC_LEN {
        return None;
    }
    let mut mac = [0u8; MAC_LEN];
    for (i, byte) in mac.iter_mut().enumerate() {
        *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(mac)
}

/// A session's credential as its process holds it: renewed in place when
/// the agent sends a fresh one, so every holder presents the newest.
#[derive(Clone, Debug)]
pub struct Renewable(std::sync::Arc<std::sync::RwLock<Credential>>);

impl Renewable {
    pub fn new(credential: Credential) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(credential)))
    }

    /// The newest credential.
    pub fn current(&self) -> Credential {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes `text`, a fresh credential of the same session.
    ///
    /// # Errors
    /// Text that is not a session credential, or names another session.
    pub fn renew(&self, text: &str) -> Result<(), &'static str> {
        let fresh = Credential::parse_session(text)?;
        let mut held = self.0.write().unwrap_or_else(|e| e.into_inner());
        if fresh.session_id() != held.session_id() {
            return Err("a renewal names another session");
        }
        *held = fresh;
        Ok(())
    }
}

/// Client-side interceptor that presents a credential on every call (the
/// newest, for a renewable one).
#[derive(Clone)]
pub struct AttachCredential(Presented);

#[derive(Clone)]
enum Presented {
    Nothing,
    Fixed(MetadataValue<Ascii>),
    Renewable(Renewable),
}

fn bearer(credential: &Credential) -> Option<MetadataValue<Ascii>> {
    format!("Bearer {}", credential.as_str()).parse().ok()
}

impl AttachCredential {
    pub fn new(credential: &Credential) -> Self {
        Self(bearer(credential).map_or(Presented::Nothing, Presented::Fixed))
    }

    /// Presents the newest of `credential` on each call.
    pub fn renewable(credential: &Renewable) -> Self {
        Self(Presented::Renewable(credential.clone()))
    }

    /// Presents nothing (an application opening a session on its agent's
    /// Unix socket, admitted by the socket's permissions).
    pub fn none() -> Self {
        Self(Presented::Nothing)
    }
}

impl tonic::service::Interceptor for AttachCredential {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let value = match &self.0 {
            Presented::Nothing => None,
            Presented::Fixed(v) => Some(v.clone()),
            Presented::Renewable(r) => bearer(&r.current()),
        };
        if let Some(v) = value {
            req.metadata_mut().insert(AUTH_METADATA, v);
        }
        Ok(req)
    }
}

/// Who a server admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admits {
    /// The cluster token and node credentials (the master).
    Members,
    /// The token or a session credential (an agent's TCP services).
    MembersAndSessions,
    /// Those, and callers that present nothing (the agent's Unix socket,
    /// whose permissions admit local applications).
    Local,
}

/// Server-side interceptor: checks the credential a call presents, refuses
/// what the server does not admit, and tells the service who it is
/// ([`Principal`] in the request's extensions; none for a local caller
/// that presented nothing).
#[derive(Clone, Debug)]
pub struct Authenticate {
    keys: Keyring,
    admits: Admits,
}

impl Authenticate {
    /// Operators and nodes (the master): not sessions.
    pub fn members(keys: Keyring) -> Self {
        Self {
            keys,
            admits: Admits::Members,
        }
    }

    /// Operators, nodes and sessions.
    pub fn new(keys: Keyring) -> Self {
        Self {
            keys,
            admits: Admits::MembersAndSessions,
        }
    }

    /// Also callers that present nothing (they get no principal).
    pub fn local(keys: Keyring) -> Self {
        Self {
            keys,
            admits: Admits::Local,
        }
    }
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let presented = req
            .metadata()
            .get(AUTH_METADATA)
            .map(|v| v.as_bytes())
            .and_then(|v| v.strip_prefix(b"Bearer "));
        let members = self.admits == Admits::Members;
        match presented.map(|p| self.keys.authenticate(p)) {
            Some(Some(Principal::Session(_))) if members => Err(Status::unauthenticated(
                "permission denied: wrong cluster token or node credential",
            )),
            Some(Some(who)) => {
                crate::proven::prove(&req);
                req.extensions_mut().insert(who);
                Ok(req)
            }
            Some(None) if members => Err(Status::unauthenticated(
                "permission denied: wrong cluster token or node credential",
            )),
            Some(None) => Err(Status::unauthenticated(
                "permission denied: wrong cluster token or session credential",
            )),
            None if self.admits == Admits::Local => Ok(req),
            None if members => Err(Status::unauthenticated(
                "permission denied: no cluster token presented",
            )),
            None => Err(Status::unauthenticated(
                "permission denied: no cluster token or session credential presented",
            )),
        }
    }
}

/// The principal an [`Authenticate`] interceptor admitted the request as.
pub fn principal<T>(req: &Request<T>) -> Option<&Principal> {
    req.extensions().get::<Principal>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interceptors_agree() {
        use tonic::service::Interceptor;
        let good = Token::new("abc").unwrap();
        let bad = Token::new("abd").unwrap();
        let session = Credential::session(&good, "n1-7", unix_now() + 60);
        let call = |c: &Credential| AttachCredential::new(c).call(Request::new(())).unwrap();
        let cluster = Keyring::Cluster(good.clone());
        let node = Keyring::Node(std::sync::Arc::new(NodeKeys::derive(&good, "n1")));
        let mut members = Authenticate::members(cluster.clone());
        let mut agents = Authenticate::new(node.clone());
        let mut local = Authenticate::local(node);
        let ok = members.call(call(&Credential::member(&good))).unwrap();
        assert_eq!(principal(&ok), Some(&Principal::Member));
        let ok = agents.call(call(&Credential::member(&good))).unwrap();
        assert_eq!(
            principal(&ok),
            Some(&Principal::Member),
            "checked by the verifier"
        );
        for check in [&mut members, &mut agents, &mut local] {
            let err = check.call(call(&Credential::member(&bad))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
            assert!(err.message().contains("permission denied"));
        }
        // A node's credential reaches the master, as that node, and no
        // agent (its own included).
        let n1 = Credential::node(&good, "n1");
        let ok = members.call(call(&n1)).unwrap();
        assert_eq!(principal(&ok), Some(&Principal::Node("n1".into())));
        assert!(agents.call(call(&n1)).is_err());
        assert!(agents.call(call(&Credential::node(&good, "n2"))).is_err());
        assert!(members.call(call(&Credential::node(&bad, "n1"))).is_err());
        // A session reaches agents, never the master.
        let err = members.call(call(&session)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let ok = agents.call(call(&session)).unwrap();
        assert_eq!(principal(&ok), Some(&Principal::Session("n1-7".into())));
        // Presenting nothing passes only the local socket, as nobody.
        assert!(members.call(Request::new(())).is_err());
        assert!(agents.call(Request::new(())).is_err());
        let ok = local.call(Request::new(())).unwrap();
        assert_eq!(principal(&ok), None);
    }

    #[test]
    fn principals_are_told_apart_and_forgeries_refused() {
        let token = Token::new("s3cret-token").unwrap();
        let other = Token::new("another-cluster").unwrap();
        let cluster = Keyring::Cluster(token.clone());
        let keys = NodeKeys::derive(&token, "n1");
        let node = Keyring::Node(std::sync::Arc::new(keys.clone()));
        for ring in [&cluster, &node] {
            assert_eq!(ring.authenticate(b"s3cret-token"), Some(Principal::Member));
            let until = unix_now() + 60;
            let cred = keys.session("n1-7", until);
            assert!(
                cred == Credential::session(&token, "n1-7", until),
                "agents and the token agree"
            );
            assert_eq!(
                ring.authenticate(cred.as_bytes()),
                Some(Principal::Session("n1-7".into()))
            );
            // Made under another token, or naming another session: refused.
            let foreign = Credential::session(&other, "n1-7", until);
            assert_eq!(ring.authenticate(foreign.as_bytes()), None);
            let text = cred.as_str().replace("n1-7", "n1-8");
            assert_eq!(ring.authenticate(text.as_bytes()), None);
            // Expired (past the skew), or its expiry moved: refused.
            let past = unix_now() - CLOCK_SKEW.as_secs() - 1;
            let expired = keys.session("n1-7", past);
            assert_eq!(ring.authenticate(expired.as_bytes()), None);
            let moved = expired
                .as_str()
                .replace(&past.to_string(), &until.to_string());
            assert_eq!(ring.authenticate(moved.as_bytes()), None);
            // Within the skew: still good (another node's clock is ahead).
            let skewed = keys.session("n1-7", unix_now() - 5);
            assert_eq!(
                ring.authenticate(skewed.as_bytes()),
                Some(Principal::Session("n1-7".into()))
            );
            // A node credential renamed: refused.
            let renamed = keys.credential().as_str().replace("node:n1:", "node:n2:");
            assert_eq!(ring.authenticate(renamed.as_bytes()), None);
            for junk in [
                &b""[..],
                b"session:",
                b"session::00",
                b"session:x:zz",
                b"node:",
                b"node:n1:",
                &[0xff, 0xfe],
            ] {
                assert_eq!(ring.authenticate(junk), None);
            }
        }
        // Nothing an agent holds is the token or another node's credential.
        let text = keys.to_text();
        assert!(!text.contains("s3cret-token"));
        assert_eq!(
            node.authenticate(Credential::node(&token, "n2").as_bytes()),
            None
        );
        let back = NodeKeys::parse(&text).unwrap();
        assert_eq!(back.name(), "n1");
        assert!(back.credential() == keys.credential());
        assert!(back.session("n1-7", 99) == keys.session("n1-7", 99));
        assert!(NodeKeys::parse("oncilla-node-keys-v1 node:n1:00").is_err());
        assert!(NodeKeys::parse("s3cret-token").is_err());
        assert!(!format!("{keys:?}").contains(&hex(&keys.sessions)));
        let cred = keys.session("n1-7", 99);
        assert!(Credential::parse_session(cred.as_str()).is_ok());
        assert_eq!(cred.session_id(), Some("n1-7"));
        // A renewal takes a fresh credential of the same session only.
        let held = Renewable::new(cred.clone());
        held.renew(keys.session("n1-7", 100).as_str()).unwrap();
        assert!(held.current() == keys.session("n1-7", 100));
        assert!(held.renew(keys.session("n1-8", 100).as_str()).is_err());
        assert!(held.renew("s3cret-token").is_err());
        assert!(Credential::parse_session("s3cret-token").is_err());
        assert!(!format!("{cred:?}").contains("n1-7"));
        assert!(Token::new("node:x").is_err() && Token::new("session:x").is_err());
    }
}
