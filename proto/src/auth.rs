//! The cluster token: how it is loaded, attached to calls and checked.
//!
//! Every gRPC call carries `authorization: Bearer <token>` and every data
//! connection presents the token in its handshake. Comparison is constant
//! time. This module never logs or prints a token.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

/// Metadata key that carries the token.
pub const AUTH_METADATA: &str = "authorization";
/// Longest token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 1024;

/// Why no usable token was found.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("no cluster token: pass --token, set ONCILLA_TOKEN, or point --token-file / ONCILLA_TOKEN_FILE at a file")]
    Missing,
    #[error(
        "invalid cluster token: {0} (use 1 to 1024 printable ASCII characters without spaces)"
    )]
    Invalid(&'static str),
    #[error("cannot read token file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A cluster token. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Validates a token string.
    ///
    /// # Errors
    /// [`TokenError::Invalid`] when empty, too long, or not printable ASCII.
    pub fn new(value: &str) -> Result<Self, TokenError> {
        if value.is_empty() {
            return Err(TokenError::Invalid("empty"));
        }
        if value.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Invalid("longer than 1024 bytes"));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Invalid("not printable ASCII"));
        }
        Ok(Self(value.into()))
    }

    /// Loads the token from an explicit value or, failing that, a file
    /// (surrounding whitespace is trimmed).
    ///
    /// # Errors
    /// [`TokenError::Missing`] when neither is given; file and validation errors.
    pub fn resolve(value: Option<&str>, file: Option<&Path>) -> Result<Self, TokenError> {
        if let Some(v) = value {
            return Self::new(v);
        }
        let Some(path) = file else {
            return Err(TokenError::Missing);
        };
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::File {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(text.trim())
    }

    /// Loads the token from `ONCILLA_TOKEN` or the file named by `ONCILLA_TOKEN_FILE`.
    ///
    /// # Errors
    /// As [`Token::resolve`].
    pub fn from_env() -> Result<Self, TokenError> {
        let value = std::env::var("ONCILLA_TOKEN").ok();
        let file = std::env::var_os("ONCILLA_TOKEN_FILE");
        Self::resolve(value.as_deref(), file.as_deref().map(Path::new))
    }

    /// A fresh random token (128 bits, hex) for a new cluster.
    pub fn random() -> Self {
        let hex: String = rand::random::<[u8; 16]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Self(hex.into())
    }

    /// The token's text, to store in a token file.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The token's bytes, for the data handshake.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Constant-time comparison with a presented token.
    pub fn matches(&self, presented: &[u8]) -> bool {
        ct_eq(self.0.as_bytes(), presented)
    }

    fn bearer(&self) -> MetadataValue<Ascii> {
        // A validated token is printable ASCII, which is always valid metadata.
        MetadataValue::try_from(format!("Bearer {}", self.0))
            .unwrap_or_else(|_| MetadataValue::from_static(""))
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Client-side interceptor that attaches the token to every call.
#[derive(Clone)]
pub struct AttachToken(MetadataValue<Ascii>);

impl AttachToken {
    pub fn new(token: &Token) -> Self {
        Self(token.bearer())
    }
}

impl tonic::service::Interceptor for AttachToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(AUTH_METADATA, self.0.clone());
        Ok(req)
    }
}

/// Server-side interceptor that rejects calls without the right token.
#[derive(Clone, Debug)]
pub struct CheckToken(Token);

impl CheckToken {
    pub fn new(token: Token) -> Self {
        Self(token)
    }
}

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let presented = req
            .metadata()
            .get(AUTH_METADATA)
            .map(|v| v.as_bytes())
            .and_then(|v| v.strip_prefix(b"Bearer "));
        match presented {
            Some(p) if self.0.matches(p) => Ok(req),
            Some(_) => Err(Status::unauthenticated(
                "permission denied: wrong cluster token",
            )),
            None => Err(Status::unauthenticated(
                "permission denied: no cluster token presented",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn validates() {
        assert!(Token::new("").is_err());
        assert!(Token::new("has space").is_err());
        assert!(Token::new(&"x".repeat(1025)).is_err());
        assert!(Token::new("s3cr3t-token").is_ok());
        assert!(matches!(
            Token::resolve(None, None),
            Err(TokenError::Missing)
        ));
    }

    #[test]
    fn debug_redacts() {
        let t = Token::new("s3cr3t").unwrap();
        assert!(!format!("{t:?}").contains("s3cr3t"));
    }

    #[test]
    fn interceptors_agree() {
        let good = Token::new("abc").unwrap();
        let bad = Token::new("abd").unwrap();
        let mut check = CheckToken::new(good.clone());
        let req = AttachToken::new(&good).call(Request::new(())).unwrap();
        assert!(check.call(req).is_ok());
        let req = AttachToken::new(&bad).call(Request::new(())).unwrap();
        let err = check.call(req).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(err.message().contains("permission denied"));
        assert!(check.call(Request::new(())).is_err());
    }
}
