//! The cluster token: how it is loaded and validated, constant-time
//! comparison of secrets, and how files that guard the cluster are read
//! (private) and written (new, of exactly their mode, never through what
//! someone planted at the path). How it (or a session's credential) is presented
//! and checked on calls is [`crate::credential`]. This module never logs or
//! prints a token.

use oncilla_model::secret::ct_eq;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Metadata key that carries the token.
pub const AUTH_METADATA: &str = "authorization";
/// Longest token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Shortest token a daemon guards a cluster (or its metrics) with: a
/// 1-byte token is guessed at once.
pub const MIN_TOKEN_LEN: usize = 16;

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
    #[error("the {what} is {len} bytes; a daemon takes at least {MIN_TOKEN_LEN} (make one with `openssl rand -hex 16`)")]
    Short { what: &'static str, len: usize },
    #[error("token file {path} has mode {mode:04o}: group or others may read or write it; run `chmod 600 {path}`")]
    Mode { path: String, mode: u32 },
    #[error("token file {path} is owned by uid {owner}, not by this user (uid {me}) or root; run `chown {me} {path}` or use your own token file")]
    Owner { path: String, owner: u32, me: u32 },
}

/// A cluster token. `Debug` never shows it; `==` takes time that depends
/// only on the lengths.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(self.0.as_bytes(), other.0.as_bytes())
    }
}

impl Eq for Token {}

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
        if value.starts_with("node:") || value.starts_with("session:") {
            return Err(TokenError::Invalid(
                "starts with node: or session:, as other credentials do",
            ));
        }
        Ok(Self(value.into()))
    }

    /// Loads the token from an explicit value or, failing that, a file
    /// (surrounding whitespace is trimmed). The file must be private, as
    /// ssh asks of its keys: readable and writable only by its owner
    /// (mode `0600` or stricter), who is this user or root.
    ///
    /// # Errors
    /// [`TokenError::Missing`] when neither is given; [`TokenError::Mode`],
    /// [`TokenError::Owner`] for a file others could read or change; file
    /// and validation errors.
    pub fn resolve(value: Option<&str>, file: Option<&Path>) -> Result<Self, TokenError> {
        if let Some(v) = value {
            return Self::new(v);
        }
        let Some(path) = file else {
            return Err(TokenError::Missing);
        };
        Self::new(read_private(path)?.trim())
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

    /// The token, when it is long enough to guard a daemon (the `what`
    /// the error names: "cluster token", "metrics token").
    ///
    /// # Errors
    /// [`TokenError::Short`] under [`MIN_TOKEN_LEN`] bytes.
    pub fn strong(self, what: &'static str) -> Result<Self, TokenError> {
        match self.0.len() {
            len if len < MIN_TOKEN_LEN => Err(TokenError::Short { what, len }),
            _ => Ok(self),
        }
    }

    /// A fresh random token (128 bits, hex) for a new cluster.
    pub fn random() -> Self {
        Self(hex(&rand::random::<[u8; 16]>()).into())
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
}

/// Refuses a token file (mode bits, owner uid) that group or others may
/// read or write, or that belongs to someone other than `me` and root.
fn check_private(
    mode: u32,
    owner: u32,
    me: u32,
    path: impl Fn() -> String,
) -> Result<(), TokenError> {
    let mode = mode & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Mode { path: path(), mode });
    }
    if owner != me && owner != 0 {
        return Err(TokenError::Owner {
            path: path(),
            owner,
            me,
        });
    }
    Ok(())
}

/// Writes `bytes` to a new file of exactly `mode` beside `path` (created
/// with `O_CREAT | O_EXCL | O_NOFOLLOW` under a random name, so nothing
/// planted can be opened instead), then renames it onto `path`: whatever
/// was at `path` (a file, a symlink) is replaced, never written into or
/// followed. In a sticky directory (`/tmp`) someone else's file at `path`
/// makes the rename fail (`EPERM`): their file is left as it was.
///
/// # Errors
/// `path` names no file; the file cannot be made, written or renamed.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), std::io::Error> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.{:016x}.tmp",
        name.to_string_lossy(),
        rand::random::<u64>()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(&tmp)?;
    let written = (|| {
        // The umask may have taken bits off, or added none: exactly `mode`.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// `bytes` as lowercase hex digits (secrets' text forms).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The text of a secret file (a token or node keys), which must be private,
/// as ssh asks of its keys: readable and writable only by its owner (mode
/// `0600` or stricter), who is this user or root.
///
/// # Errors
/// [`TokenError::Mode`], [`TokenError::Owner`] for a file others could
/// read or change; [`TokenError::File`] when it cannot be read.
pub fn read_private(path: &Path) -> Result<String, TokenError> {
    use std::os::unix::fs::MetadataExt;
    let shown = || path.display().to_string();
    let io = |source| TokenError::File {
        path: shown(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    // The open file's own metadata: what is checked is what is read.
    let meta = f.metadata().map_err(io)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    check_private(meta.mode(), meta.uid(), me, shown)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut f, &mut text).map_err(io)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(Token::new("").is_err());
        assert!(Token::new("has space").is_err());
        assert!(Token::new(&"x".repeat(1025)).is_err());
        assert!(Token::new("s3cr3t-token").is_ok());
        let short = Token::new("s3cr3t-token").unwrap().strong("cluster token");
        assert!(
            matches!(&short, Err(e) if e.to_string().contains("cluster token is 12 bytes")),
            "{short:?}"
        );
        assert!(Token::random().strong("cluster token").is_ok());
        assert!(matches!(
            Token::resolve(None, None),
            Err(TokenError::Missing)
        ));
    }

    /// A token file at `mode`, in a fresh directory.
    fn token_file(name: &str, mode: u32) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("oncilla-auth-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "s3cr3t-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn token_files_must_be_private() {
        for mode in [0o600, 0o400, 0o700] {
            let path = token_file(&format!("ok{mode:o}"), mode);
            let t = Token::resolve(None, Some(&path)).unwrap();
            assert_eq!(t.as_str(), "s3cr3t-token");
            std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        }
        for mode in [
            0o644, 0o640, 0o604, 0o660, 0o666, 0o602, 0o620, 0o610, 0o601,
        ] {
            let path = token_file(&format!("bad{mode:o}"), mode);
            let err = Token::resolve(None, Some(&path)).unwrap_err();
            assert!(
                matches!(err, TokenError::Mode { mode: m, .. } if m == mode),
                "{mode:o}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("mode {mode:04o}")), "{msg}");
            assert!(
                msg.contains(&format!("chmod 600 {}", path.display())),
                "{msg}"
            );
            std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn token_files_of_other_users_are_refused() {
        let path = || "/etc/oncilla/token".to_string();
        assert!(check_private(0o100600, 1000, 1000, path).is_ok());
        // Root's files are trusted (a token installed by the administrator).
        assert!(check_private(0o100400, 0, 1000, path).is_ok());
        let err = check_private(0o100600, 1234, 1000, path).unwrap_err();
        assert!(
            matches!(
                err,
                TokenError::Owner {
                    owner: 1234,
                    me: 1000,
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("/etc/oncilla/token is owned by uid 1234"),
            "{msg}"
        );
        // The mode is checked first, whoever owns the file.
        let err = check_private(0o100644, 1234, 1000, path).unwrap_err();
        assert!(matches!(err, TokenError::Mode { mode: 0o644, .. }), "{err}");
    }

    #[test]
    fn secrets_compare_in_constant_time_and_correctly() {
        let t = Token::new("s3cr3t").unwrap();
        assert_eq!(t, Token::new("s3cr3t").unwrap());
        assert_ne!(t, Token::new("s3cr3u").unwrap());
        assert_ne!(t, Token::new("s3cr3t-longer").unwrap());
    }

    #[test]
    fn debug_redacts() {
        let t = Token::new("s3cr3t").unwrap();
        assert!(!format!("{t:?}").contains("s3cr3t"));
    }
}
