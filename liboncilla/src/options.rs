//! Every `ONCILLA_*` setting of the client, read in one place.
//!
//! [`Options`] owns the session settings (socket, token, fabric, streams),
//! the GPU staging size and the verbs settings ([`RdmaOptions`]). They are
//! parsed from any variable lookup ([`Options::from_vars`]), so tests pass
//! a map instead of changing the process environment. Nothing else in the
//! library reads the environment. This module never opens anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use oncilla_model::Fabric;
use oncilla_net::auth::{Token, TokenError};

use crate::affinity::Affinity;
use crate::error::{Error, Result};

/// Connections per node one copy uses unless configured otherwise.
pub const DEFAULT_STREAMS: usize = 4;
/// Default bytes per GPU staging buffer (`ONCILLA_GPU_STAGING`).
pub const STAGING_DEFAULT: usize = 8 << 20;
/// Default seconds before an idle verbs queue pair closes.
pub const RDMA_IDLE_DEFAULT: Duration = Duration::from_secs(60);

/// A setting whose value is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {value:?} is not {expected}")]
#[non_exhaustive]
pub struct OptionError {
    pub var: &'static str,
    pub value: String,
    pub expected: String,
}

/// How to reach the local agent, and how to move bytes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// The agent's Unix socket.
    pub socket: PathBuf,
    /// The cluster token, when this process has one (operators, tools);
    /// applications need none: their agent admits them by its socket's
    /// permissions and gives the session a credential of its own.
    pub token: Option<Token>,
    /// Fabric preference for every allocation of the session.
    pub fabric: Fabric,
    /// Most TCP connections one copy uses per node (each moves at least
    /// 1 MiB).
    pub streams: usize,
    /// Bytes per GPU staging buffer (`ONCILLA_GPU_STAGING`, 64 KiB to
    /// 1 GiB); a bad value fails the first copy that stages, not the
    /// session.
    pub gpu_staging: std::result::Result<usize, OptionError>,
    /// The verbs fabric's settings.
    pub rdma: RdmaOptions,
}

/// Settings of the verbs fabric (`ONCILLA_RDMA_*`). Bad values do not fail
/// the session: the fabric is then unavailable, with them as the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaOptions {
    /// Ports to open (`ONCILLA_RDMA_DEVICE`, `NAME[:PORT]` comma-separated;
    /// empty: every active port).
    pub devices: Vec<String>,
    /// Bytes per work request (`ONCILLA_RDMA_CHUNK`); `None`: the default.
    pub chunk: Option<u64>,
    /// Work requests in flight (`ONCILLA_RDMA_WINDOW`); `None`: the default.
    pub window: Option<usize>,
    /// Idle time before a queue pair closes (`ONCILLA_RDMA_IDLE_S`).
    pub idle: Duration,
    /// Where progress threads run (`ONCILLA_RDMA_AFFINITY`).
    pub affinity: Affinity,
    /// Values that were not accepted.
    pub invalid: Vec<OptionError>,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        Self {
            devices: Vec::new(),
            chunk: None,
            window: None,
            idle: RDMA_IDLE_DEFAULT,
            affinity: Affinity::None,
            invalid: Vec::new(),
        }
    }
}

/// Largest bytes one verbs work request may carry (32-bit length).
const RDMA_CHUNK_MAX: u64 = 1 << 31;

impl Options {
    /// Every setting from the process environment ([`Options::from_vars`]).
    ///
    /// # Errors
    /// As [`Options::from_vars`].
    pub fn from_env() -> Result<Self> {
        Self::from_vars(env)
    }

    /// Every setting from `var` (a variable lookup): `ONCILLA_SOCKET`
    /// (default `/run/oncilla/agent.sock`), the token from `ONCILLA_TOKEN`
    /// or the file `ONCILLA_TOKEN_FILE` names, `ONCILLA_FABRIC` (`auto`,
    /// `tcp`, `shm` or `verbs`; default `auto`), `ONCILLA_STREAMS`
    /// (connections per node for one copy, 1 to 64; default
    /// [`DEFAULT_STREAMS`]), `ONCILLA_GPU_STAGING` and the `ONCILLA_RDMA_*`
    /// settings ([`RdmaOptions`]).
    ///
    /// # Errors
    /// [`Error::Token`] when no token is configured;
    /// [`Error::InvalidArgument`] for an unknown fabric or a bad stream count.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let socket = var("ONCILLA_SOCKET")
            .map_or_else(|| PathBuf::from(oncilla_net::DEFAULT_SOCKET), PathBuf::from);
        let fabric = match var("ONCILLA_FABRIC") {
            Some(v) => Fabric::parse(&v)
                .map_err(|e| Error::InvalidArgument(format!("ONCILLA_FABRIC: {e}")))?,
            None => Fabric::Auto,
        };
        let streams = match var("ONCILLA_STREAMS") {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "ONCILLA_STREAMS: {v:?} is not a number from 1 to 64"
                    ))
                })?,
            None => DEFAULT_STREAMS,
        };
        let token_file = var("ONCILLA_TOKEN_FILE");
        let token = match Token::resolve(
            var("ONCILLA_TOKEN").as_deref(),
            token_file.as_deref().map(Path::new),
        ) {
            Ok(t) => Some(t),
            Err(TokenError::Missing) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Self {
            socket,
            token,
            fabric,
            streams,
            gpu_staging: gpu_staging(&var),
            rdma: RdmaOptions::from_vars(&var),
        })
    }

    /// The agent at `socket` with `token`, fabric chosen automatically,
    /// [`DEFAULT_STREAMS`] connections; the GPU staging and verbs settings
    /// still come from the environment.
    pub fn new(socket: impl Into<PathBuf>, token: Token) -> Self {
        Self {
            token: Some(token),
            ..Self::without_token(socket)
        }
    }

    /// The agent at `socket`, as an application without the cluster token
    /// (the session's own credential opens its copies); otherwise as
    /// [`Options::new`].
    pub fn without_token(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            token: None,
            fabric: Fabric::Auto,
            streams: DEFAULT_STREAMS,
            gpu_staging: gpu_staging(&env),
            rdma: RdmaOptions::from_vars(env),
        }
    }

    /// Uses up to `n` connections per node for one copy (at least one).
    #[must_use]
    pub fn streams(mut self, n: usize) -> Self {
        self.streams = n.max(1);
        self
    }
}

impl RdmaOptions {
    /// The `ONCILLA_RDMA_*` settings from `var`; empty values count as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let mut me = Self {
            devices: var("ONCILLA_RDMA_DEVICE")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default(),
            ..Self::default()
        };
        let mut num = |k: &'static str, min: u64, max: u64| -> Option<u64> {
            let v = var(k)?;
            match v.trim().parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    me.invalid.push(OptionError {
                        var: k,
                        value: v,
                        expected: format!("a number from {min} to {max}"),
                    });
                    None
                }
            }
        };
        let chunk = num("ONCILLA_RDMA_CHUNK", 4096, RDMA_CHUNK_MAX);
        let window = num("ONCILLA_RDMA_WINDOW", 1, 1024).map(|w| usize::try_from(w).unwrap_or(32));
        let idle = num("ONCILLA_RDMA_IDLE_S", 1, 86_400).map(Duration::from_secs);
        me.chunk = chunk;
        me.window = window;
        if let Some(idle) = idle {
            me.idle = idle;
        }
        if let Some(v) = var("ONCILLA_RDMA_AFFINITY") {
            match Affinity::parse(&v) {
                Ok(a) => me.affinity = a,
                Err(_) => me.invalid.push(OptionError {
                    var: "ONCILLA_RDMA_AFFINITY",
                    value: v,
                    expected: "none, hca-socket or core:N".into(),
                }),
            }
        }
        me
    }
}

/// `ONCILLA_GPU_STAGING`: bytes per staging buffer (64 KiB to 1 GiB).
fn gpu_staging(var: &impl Fn(&str) -> Option<String>) -> std::result::Result<usize, OptionError> {
    match var("ONCILLA_GPU_STAGING") {
        Some(v) => oncilla_model::size::parse_size(&v)
            .ok()
            .filter(|n| (64 << 10..=1 << 30).contains(n))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(OptionError {
                var: "ONCILLA_GPU_STAGING",
                value: v,
                expected: "a size from 64KiB to 1GiB".into(),
            }),
        None => Ok(STAGING_DEFAULT),
    }
}

/// The process environment as a variable lookup (unset or not UTF-8: `None`).
fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_need_nothing_and_a_token_is_optional() {
        let o = Options::from_vars(vars(&[("ONCILLA_TOKEN", "t0k")])).unwrap();
        assert_eq!(o.socket, PathBuf::from(oncilla_net::DEFAULT_SOCKET));
        assert_eq!(o.token.as_ref().map(Token::as_str), Some("t0k"));
        assert_eq!(o.fabric, Fabric::Auto);
        assert_eq!(o.streams, DEFAULT_STREAMS);
        assert_eq!(o.gpu_staging, Ok(STAGING_DEFAULT));
        assert_eq!(o.rdma, RdmaOptions::default());
        // An application needs no token; a token given must be valid.
        assert_eq!(Options::from_vars(vars(&[])).unwrap().token, None);
        assert!(matches!(
            Options::from_vars(vars(&[("ONCILLA_TOKEN", "has space")])),
            Err(Error::Token(_))
        ));
    }

    #[test]
    fn every_variable_is_read() {
        let o = Options::from_vars(vars(&[
            ("ONCILLA_TOKEN", "t"),
            ("ONCILLA_SOCKET", "/tmp/a.sock"),
            ("ONCILLA_FABRIC", "TCP"),
            ("ONCILLA_STREAMS", "8"),
            ("ONCILLA_GPU_STAGING", "1MiB"),
            ("ONCILLA_RDMA_DEVICE", "mlx5_0:1, rxe0"),
            ("ONCILLA_RDMA_CHUNK", "65536"),
            ("ONCILLA_RDMA_WINDOW", "16"),
            ("ONCILLA_RDMA_IDLE_S", "5"),
            ("ONCILLA_RDMA_AFFINITY", "core:2"),
        ]))
        .unwrap();
        assert_eq!(o.socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(o.fabric, Fabric::Tcp);
        assert_eq!(o.streams, 8);
        assert_eq!(o.gpu_staging, Ok(1 << 20));
        assert_eq!(o.rdma.devices, ["mlx5_0:1", "rxe0"]);
        assert_eq!(o.rdma.chunk, Some(65536));
        assert_eq!(o.rdma.window, Some(16));
        assert_eq!(o.rdma.idle, Duration::from_secs(5));
        assert_eq!(o.rdma.affinity, Affinity::Core(2));
        assert!(o.rdma.invalid.is_empty());
    }

    #[test]
    fn bad_session_values_fail_and_bad_tuning_is_kept_as_the_reason() {
        for (k, v) in [
            ("ONCILLA_FABRIC", "carrier-pigeon"),
            ("ONCILLA_STREAMS", "0"),
            ("ONCILLA_STREAMS", "65"),
        ] {
            let err = Options::from_vars(vars(&[("ONCILLA_TOKEN", "t"), (k, v)])).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidArgument(m) if m.starts_with(k)),
                "{k}={v}: {err}"
            );
        }
        let o = Options::from_vars(vars(&[
            ("ONCILLA_TOKEN", "t"),
            ("ONCILLA_GPU_STAGING", "1KiB"),
            ("ONCILLA_RDMA_CHUNK", "12"),
            ("ONCILLA_RDMA_AFFINITY", "everywhere"),
            ("ONCILLA_RDMA_WINDOW", " "),
        ]))
        .unwrap();
        let staging = o.gpu_staging.unwrap_err();
        assert_eq!(staging.var, "ONCILLA_GPU_STAGING");
        assert!(staging.to_string().contains("64KiB to 1GiB"), "{staging}");
        let bad: Vec<_> = o.rdma.invalid.iter().map(|e| e.var).collect();
        assert_eq!(bad, ["ONCILLA_RDMA_CHUNK", "ONCILLA_RDMA_AFFINITY"]);
        assert_eq!(o.rdma.chunk, None);
        assert_eq!(o.rdma.window, None, "blank counts as unset");
        assert_eq!(
            o.rdma.invalid[0].to_string(),
            "ONCILLA_RDMA_CHUNK: \"12\" is not a number from 4096 to 2147483648"
        );
    }

    #[test]
    fn streams_builder_keeps_at_least_one() {
        let o = Options::from_vars(vars(&[("ONCILLA_TOKEN", "t")]))
            .unwrap()
            .streams(0);
        assert_eq!(o.streams, 1);
    }
}
