//! Who a caller is: a cluster member (a node or an operator, holding the
//! cluster token) or one application session (holding the credential its
//! local agent issued when the session opened). Applications never need
//! the cluster token: the credential is HMAC-SHA256 of the session id
//! under the token, so every agent can check it without asking anyone, and
//! it opens nothing but that session's data-path connections and RDMA
//! queue pairs (the allocations themselves still need their access keys).
//!
//! Both travel the same way: as the bearer value of `authorization`
//! metadata and as the secret of a data-path hello. This module checks and
//! makes them (comparison in constant time); it never logs one.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

use crate::auth::{ct_eq, Token, AUTH_METADATA};

/// How a session credential starts (a token never does: see
/// [`authenticate`]).
const SESSION_PREFIX: &str = "session:";
/// Longest session id a credential may name.
const MAX_SESSION_ID: usize = 128;
/// Bytes of the MAC.
const MAC_LEN: usize = 32;

/// Who presented a valid secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A node or operator: holds the cluster token.
    Member,
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

    /// The credential of session `session_id`, as its agent issues it.
    pub fn session(token: &Token, session_id: &str) -> Self {
        Self(
            format!(
                "{SESSION_PREFIX}{session_id}:{}",
                hex(&mac(token, session_id))
            )
            .into(),
        )
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

    /// The text form (bearer value, hello secret).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Who `presented` belongs to under `token`: [`Principal::Member`] for the
/// token, [`Principal::Session`] for a session credential the token made;
/// `None` otherwise. Constant time in the secret's bytes.
pub fn authenticate(token: &Token, presented: &[u8]) -> Option<Principal> {
    if token.matches(presented) {
        return Some(Principal::Member);
    }
    let (id, claimed) = parse_session(presented)?;
    ct_eq(&mac(token, id), &claimed).then(|| Principal::Session(id.to_string()))
}

fn mac(token: &Token, session_id: &str) -> [u8; MAC_LEN] {
    // A key of any length is accepted by HMAC: this cannot fail.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
        return [0; MAC_LEN];
    };
    m.update(b"oncilla session credential\0");
    m.update(session_id.as_bytes());
    m.finalize().into_bytes().into()
}

/// `session:<id>:<64 hex digits>` as (id, mac).
fn parse_session(presented: &[u8]) -> Option<(&str, [u8; MAC_LEN])> {
    let text = std::str::from_utf8(presented).ok()?;
    let rest = text.strip_prefix(SESSION_PREFIX)?;
    let (id, digits) = rest.rsplit_once(':')?;
    if id.is_empty() || id.len() > MAX_SESSION_ID || digits.len() != 2 * MAC_LEN {
        return None;
    }
    let mut mac = [0u8; MAC_LEN];
    for (i, byte) in mac.iter_mut().enumerate() {
        *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((id, mac))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Client-side interceptor that presents a credential on every call.
#[derive(Clone)]
pub struct AttachCredential(Option<MetadataValue<Ascii>>);

impl AttachCredential {
    pub fn new(credential: &Credential) -> Self {
        Self(format!("Bearer {}", credential.as_str()).parse().ok())
    }

    /// Presents nothing (an application opening a session on its agent's
    /// Unix socket, admitted by the socket's permissions).
    pub fn none() -> Self {
        Self(None)
    }
}

impl tonic::service::Interceptor for AttachCredential {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert(AUTH_METADATA, v.clone());
        }
        Ok(req)
    }
}

/// Who a server admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admits {
    /// The cluster token only (the master).
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
    token: Token,
    admits: Admits,
}

impl Authenticate {
    /// The cluster token only.
    pub fn members(token: Token) -> Self {
        Self {
            token,
            admits: Admits::Members,
        }
    }

    /// Members and sessions.
    pub fn new(token: Token) -> Self {
        Self {
            token,
            admits: Admits::MembersAndSessions,
        }
    }

    /// Also callers that present nothing (they get no principal).
    pub fn local(token: Token) -> Self {
        Self {
            token,
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
        match presented.map(|p| authenticate(&self.token, p)) {
            Some(Some(Principal::Session(_))) if members => Err(Status::unauthenticated(
                "permission denied: wrong cluster token",
            )),
            Some(Some(who)) => {
                req.extensions_mut().insert(who);
                Ok(req)
            }
            Some(None) if members => Err(Status::unauthenticated(
                "permission denied: wrong cluster token",
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
        let session = Credential::session(&good, "n1-7");
        let call = |c: &Credential| AttachCredential::new(c).call(Request::new(())).unwrap();
        let mut members = Authenticate::members(good.clone());
        let mut agents = Authenticate::new(good.clone());
        let mut local = Authenticate::local(good.clone());
        let ok = members.call(call(&Credential::member(&good))).unwrap();
        assert_eq!(principal(&ok), Some(&Principal::Member));
        for check in [&mut members, &mut agents, &mut local] {
            let err = check.call(call(&Credential::member(&bad))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
            assert!(err.message().contains("permission denied"));
        }
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
    fn sessions_and_members_are_told_apart_and_forgeries_refused() {
        let token = Token::new("s3cret-token").unwrap();
        let other = Token::new("another-cluster").unwrap();
        assert_eq!(
            authenticate(&token, b"s3cret-token"),
            Some(Principal::Member)
        );
        let cred = Credential::session(&token, "n1-7");
        assert_eq!(
            authenticate(&token, cred.as_bytes()),
            Some(Principal::Session("n1-7".into()))
        );
        // Made under another token, or naming another session: refused.
        let foreign = Credential::session(&other, "n1-7");
        assert_eq!(authenticate(&token, foreign.as_bytes()), None);
        let text = cred.as_str().replace("n1-7", "n1-8");
        assert_eq!(authenticate(&token, text.as_bytes()), None);
        for junk in [
            &b""[..],
            b"session:",
            b"session::00",
            b"session:x:zz",
            &[0xff, 0xfe],
        ] {
            assert_eq!(authenticate(&token, junk), None);
        }
        assert!(Credential::parse_session(cred.as_str()).is_ok());
        assert!(Credential::parse_session("s3cret-token").is_err());
        assert!(!format!("{cred:?}").contains("n1-7"));
    }
}
