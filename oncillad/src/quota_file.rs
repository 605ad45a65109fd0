//! The master's quota file (`--quota-file`): TOML, read at start, written
//! whole by every change (`ocmctl quota set`), through a new file of mode
//! 0600 renamed onto it (`auth::write_new`: a crash mid-write leaves the
//! old table, and nothing planted at the path is followed). A missing file
//! is no quotas (it is made on the first change); one that others may
//! write is refused (anyone could raise their own quota).
//!
//! ```toml
//! [default]
//! bytes = 1073741824
//! [users.1000]
//! allocations = 100
//! persistent = 10
//! ```
//!
//! It owns the format only; what quotas mean is `oncilla_model::quota`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oncilla_model::quota::{Limits, Quotas};
use serde::{Deserialize, Serialize};

use crate::master::QuotaStore;

/// Why the quota file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum QuotaFileError {
    #[error("cannot read quota file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("quota file {path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("quota file {path} has mode {mode:04o}: group or others may change it (and so raise their own quota); run `chmod 600 {path}`")]
    Mode { path: String, mode: u32 },
    #[error("quota file {path} is owned by uid {owner}, not by this user (uid {me}) or root")]
    Owner { path: String, owner: u32, me: u32 },
    #[error("quota file {path}: its directory {dir} does not exist; every change is written there (create it: install -d -m 700 {dir})")]
    NoDirectory { path: String, dir: String },
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocations: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    persistent: Option<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileQuotas {
    #[serde(default)]
    default: FileLimits,
    /// By uid (TOML keys are strings).
    #[serde(default)]
    users: BTreeMap<String, FileLimits>,
}

impl From<FileLimits> for Limits {
    fn from(l: FileLimits) -> Self {
        Self {
            bytes: l.bytes,
            node_bytes: l.node_bytes,
            allocations: l.allocations,
            persistent: l.persistent,
        }
    }
}

impl From<&Limits> for FileLimits {
    fn from(l: &Limits) -> Self {
        Self {
            bytes: l.bytes,
            node_bytes: l.node_bytes,
            allocations: l.allocations,
            persistent: l.persistent,
        }
    }
}

/// The quotas in `path`; none where the file does not exist yet.
///
/// # Errors
/// The file cannot be read, is not TOML of this shape, or names a user
/// that is not a uid.
pub fn load(path: &Path) -> Result<Quotas, QuotaFileError> {
    use std::os::unix::fs::MetadataExt;
    let shown = || path.display().to_string();
    let read = |source| QuotaFileError::Read {
        path: shown(),
        source,
    };
    // Every change is a new file renamed onto it: found out here, not at
    // the first `ocmctl quota set`.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(QuotaFileError::NoDirectory {
            path: shown(),
            dir: dir.display().to_string(),
        });
    }
    // A file kept read-only on purpose (a mounted ConfigMap) still loads:
    // only changes fail, so this is said now, not refused. Effective ids
    // and capabilities, as the write would have them.
    if nix::unistd::eaccess(dir, nix::unistd::AccessFlags::W_OK).is_err() {
        tracing::warn!(
            path = %shown(),
            dir = %dir.display(),
            "the quota file's directory is not writable by this daemon: quotas load, and `ocmctl quota set` will fail"
        );
    }
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Quotas::default()),
        Err(source) => return Err(read(source)),
    };
    // The open file's own metadata: what is checked is what is read.
    let meta = f.metadata().map_err(read)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(QuotaFileError::Mode {
            path: shown(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(QuotaFileError::Owner {
            path: shown(),
            owner: meta.uid(),
            me,
        });
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut f, &mut text).map_err(read)?;
    let parse = |reason: String| QuotaFileError::Parse {
        path: path.display().to_string(),
        reason,
    };
    let file: FileQuotas = toml::from_str(&text).map_err(|e| parse(e.to_string()))?;
    let mut users = BTreeMap::new();
    for (uid, limits) in file.users {
        let uid: u32 = uid
            .parse()
            .map_err(|_| parse(format!("users.{uid}: a user is a numeric uid")))?;
        users.insert(uid, limits.into());
    }
    Ok(Quotas {
        default: file.default.into(),
        users,
    })
}

/// Quotas kept in a file.
pub struct QuotaFile {
    pub path: PathBuf,
}

impl QuotaStore for QuotaFile {
    fn save(&self, quotas: &Quotas) -> Result<(), String> {
        let file = FileQuotas {
            default: (&quotas.default).into(),
            users: quotas
                .users
                .iter()
                .map(|(uid, l)| (uid.to_string(), l.into()))
                .collect(),
        };
        let text = toml::to_string(&file).map_err(|e| e.to_string())?;
        let text = format!(
            "# Oncilla quotas: `ocmctl quota set` writes this file; the master reads it at start.\n{text}"
        );
        oncilla_net::auth::write_new(&self.path, text.as_bytes(), 0o600)
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_survive_a_write_and_a_read() {
        let dir = std::env::temp_dir().join(format!("oncilla-quota-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("quotas.toml");
        let _ = std::fs::remove_file(&path);
        assert_eq!(load(&path).unwrap(), Quotas::default(), "missing is none");
        let e = load(&dir.join("no-such-dir/quotas.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not exist") && e.contains("install -d"),
            "{e}"
        );
        let mut q = Quotas::default();
        q.default.bytes = Some(1 << 30);
        q.users.insert(
            1000,
            Limits {
                allocations: Some(3),
                persistent: Some(0),
                ..Limits::NONE
            },
        );
        QuotaFile { path: path.clone() }.save(&q).unwrap();
        assert_eq!(load(&path).unwrap(), q);
        std::fs::write(&path, "[users.bob]\nbytes = 1\n").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("numeric uid"), "{e}");
        std::fs::write(&path, "[default]\nbyte = 1\n").unwrap();
        assert!(load(&path).is_err(), "unknown keys are refused");
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0666") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Quotas::default(),
            "others may read it"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
