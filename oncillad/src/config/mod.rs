//! Daemon configuration: flags > `ONCILLA_*` environment > TOML file >
//! defaults. Produces one validated [`Config`]; nothing else reads flags,
//! environment or the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use oncilla_model::quota::Quotas;
use oncilla_model::size::{parse_size, SizeError};
use std::sync::Arc;

use oncilla_net::auth::{Token, TokenError};
use oncilla_net::credential::{KeysError, NodeKeys};
use oncilla_net::tls::{ClientTls, ServerTls, TlsError};
use serde::Deserialize;

use crate::master::Liveness;
use crate::pool::HugePages;

/// Oncilla node daemon. Runs the agent role (`--join`: exports this node's
/// memory), the master role (`--master`: membership, placement, allocation
/// table), or both in one process.
#[derive(Debug, Parser)]
#[command(name = "oncillad", version)]
#[deny(missing_docs)]
pub struct Cli {
    /// Run the master role.
    #[arg(long, env = "ONCILLA_MASTER_ROLE")]
    pub master: bool,
    /// Run the agent role and join the master at HOST:PORT; with standby
    /// masters, list them all (comma-separated): the agent follows the
    /// one that leads.
    #[arg(long, env = "ONCILLA_JOIN", value_name = "HOST:PORT[,HOST:PORT...]")]
    pub join: Option<String>,
    /// This node's name in the cluster [default: the host name].
    #[arg(long, env = "ONCILLA_NAME")]
    pub name: Option<String>,
    /// gRPC listen address [default: 0.0.0.0:7070].
    #[arg(long, env = "ONCILLA_LISTEN", value_name = "HOST:PORT")]
    pub listen: Option<SocketAddr>,
    /// TCP data fabric listen address (agent) [default: 0.0.0.0:7071].
    #[arg(long, env = "ONCILLA_DATA_LISTEN", value_name = "HOST:PORT")]
    pub data_listen: Option<SocketAddr>,
    /// Host name or IP other nodes and clients use to reach this one
    /// [default: the listen IP, or the host name when listening on all addresses].
    #[arg(long, env = "ONCILLA_ADVERTISE", value_name = "HOST")]
    pub advertise: Option<String>,
    /// Unix socket for local applications (agent) [default: /run/oncilla/agent.sock].
    #[arg(long, env = "ONCILLA_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Memory this node exports, e.g. 64MiB, 4GiB (agent; required with --join).
    #[arg(long, env = "ONCILLA_CAPACITY", value_name = "SIZE")]
    pub capacity: Option<String>,
    /// The failure domain this node is in (agent): a rack, a power feed, a
    /// host of VMs; letters, digits, '.', '_' and '-' [default: none].
    #[arg(long, env = "ONCILLA_ZONE", value_name = "LABEL")]
    pub zone: Option<String>,
    /// Back the pool with huge pages: `auto` uses them when enough are free
    /// and otherwise falls back to base pages (and says so), `on` refuses to
    /// start without them [default: auto].
    #[arg(long, env = "ONCILLA_HUGEPAGES", value_name = "MODE")]
    pub hugepages: Option<HugePages>,
    /// Bytes a second one user's pulls (third-party copies between two
    /// allocations) may move into this node, e.g. 1GiB; 0: no limit
    /// (agent) [default: 2GiB].
    #[arg(long, env = "ONCILLA_PULL_RATE", value_name = "SIZE")]
    pub pull_rate: Option<String>,
    /// Seconds a session credential this agent gives is good for; it gives
    /// each session a fresh one every third of that, so a credential stops
    /// working at most this long after its session ends (at once on this
    /// node) (agent) [default: 300].
    #[arg(long, env = "ONCILLA_CREDENTIAL_LIFETIME", value_name = "SECS")]
    pub credential_lifetime: Option<u64>,
    /// RDMA ports to export the pool on, `NAME` or `NAME:PORT`, repeatable
    /// or comma-separated (agent) [default: every active port]. Used only
    /// by a build with the `verbs` feature.
    #[arg(
        long = "rdma-device",
        env = "ONCILLA_RDMA_DEVICE",
        value_name = "NAME[:PORT]",
        value_delimiter = ','
    )]
    pub rdma_device: Vec<String>,
    /// Cluster token (prefer --token-file: flags show up in `ps`).
    #[arg(long, env = "ONCILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the cluster token.
    #[arg(long, env = "ONCILLA_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Agent: file holding this node's keys instead of the cluster token
    /// (`ocmctl node-keys NAME --out PATH` makes it): the agent then can
    /// act only as its own node, never as an operator or another node.
    #[arg(long, env = "ONCILLA_NODE_KEYS_FILE", value_name = "PATH")]
    pub node_keys_file: Option<PathBuf>,
    /// Agent heartbeat interval the master asks for, in milliseconds [default: 1000].
    #[arg(long, env = "ONCILLA_HEARTBEAT_MS", value_name = "MS")]
    pub heartbeat_ms: Option<u64>,
    /// Master: silence after which a node is suspect and gets no new
    /// memory, in milliseconds [default: 3 heartbeats].
    #[arg(long, env = "ONCILLA_SUSPECT_AFTER_MS", value_name = "MS")]
    pub suspect_after_ms: Option<u64>,
    /// Master: silence after which a node is down and its allocations are
    /// degraded, in milliseconds [default: 5 heartbeats].
    #[arg(long, env = "ONCILLA_DOWN_AFTER_MS", value_name = "MS")]
    pub down_after_ms: Option<u64>,
    /// TLS on every TCP listener (gRPC and data): this daemon's
    /// certificate, signed by the cluster CA (`ocmctl tls-cert`). Needs
    /// --tls-key and --tls-ca; the whole cluster uses TLS or none of it.
    #[arg(long, env = "ONCILLA_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (a file only its owner can read).
    #[arg(long, env = "ONCILLA_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA certificate (`ocmctl tls-ca`): what this daemon
    /// trusts when it dials others, and what its agent hands applications.
    #[arg(long, env = "ONCILLA_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (`GET /metrics`; off when
    /// not given). Needs --metrics-token-file.
    #[arg(long, env = "ONCILLA_METRICS_LISTEN", value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// File holding the token scrapers present (`Authorization: Bearer
    /// TOKEN`; Prometheus: `authorization: credentials_file`), mode 0600.
    /// A secret of its own: it opens only the metrics.
    #[arg(long, env = "ONCILLA_METRICS_TOKEN_FILE", value_name = "PATH")]
    pub metrics_token_file: Option<PathBuf>,
    /// Master: elect the leader among several masters through these etcd
    /// members (comma-separated URLs, e.g. http://10.0.0.5:2379); the
    /// others stand by and take over when the leader's lease ends. Without
    /// it this master always leads (one master, nothing external).
    #[arg(long, env = "ONCILLA_ETCD", value_name = "URL[,URL...]")]
    pub etcd: Option<String>,
    /// Master with --etcd: the leader's lease in seconds, the longest a
    /// dead or cut-off leader holds the cluster up [default: 5].
    #[arg(long, env = "ONCILLA_ETCD_LEASE_SECS", value_name = "SECONDS")]
    pub etcd_lease_secs: Option<u64>,
    /// Master with --etcd: the cluster's keys in etcd start with this, so
    /// clusters sharing an etcd elect apart [default: oncilla].
    #[arg(long, env = "ONCILLA_ETCD_PREFIX", value_name = "PREFIX")]
    pub etcd_prefix: Option<String>,
    /// Master: file keeping users' quotas (TOML; read at start, written by
    /// `ocmctl quota set`, made on the first change). Without it quotas
    /// cannot be set.
    #[arg(long, env = "ONCILLA_QUOTA_FILE", value_name = "PATH")]
    pub quota_file: Option<PathBuf>,
    /// TOML file with any of the settings above (snake_case keys).
    #[arg(long, env = "ONCILLA_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Check the configuration (flags over environment over file; token,
    /// key and TLS files read and checked), print the merged result as
    /// TOML without secrets, and exit: 0 when it is valid, 2 when not.
    #[arg(long)]
    pub check_config: bool,
}

/// The TOML file: every field optional, unknown keys rejected.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    master: Option<bool>,
    join: Option<String>,
    name: Option<String>,
    listen: Option<SocketAddr>,
    data_listen: Option<SocketAddr>,
    advertise: Option<String>,
    socket: Option<PathBuf>,
    capacity: Option<String>,
    zone: Option<String>,
    hugepages: Option<HugePages>,
    pull_rate: Option<String>,
    credential_lifetime: Option<u64>,
    rdma_device: Option<Vec<String>>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    node_keys_file: Option<PathBuf>,
    heartbeat_ms: Option<u64>,
    suspect_after_ms: Option<u64>,
    down_after_ms: Option<u64>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    metrics_listen: Option<SocketAddr>,
    metrics_token_file: Option<PathBuf>,
    etcd: Option<String>,
    etcd_lease_secs: Option<u64>,
    etcd_prefix: Option<String>,
    quota_file: Option<PathBuf>,
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("nothing to run: pass --master, --join MASTER_HOST:PORT, or both")]
    NoRole,
    #[error("the agent role needs --capacity (for example --capacity 4GiB)")]
    NoCapacity,
    #[error("--capacity: {0}")]
    Size(#[from] SizeError),
    #[error("--zone: {0}")]
    Zone(#[source] oncilla_model::alloc::Invalid),
    #[error("--pull-rate: {0}")]
    PullRate(#[source] SizeError),
    #[error("--credential-lifetime {0}: give {MIN_CREDENTIAL_LIFETIME} to {MAX_CREDENTIAL_LIFETIME} seconds")]
    CredentialLifetime(u64),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error("the master needs the cluster token (--token-file); --node-keys-file is for agents")]
    MasterWithKeys,
    #[error("--node-keys-file holds the keys of node {keys}, but this node is named {name}; pass --name {keys} or the keys of {name}")]
    KeysName { keys: String, name: String },
    #[error("--metrics-listen needs --metrics-token-file (the token scrapers present)")]
    MetricsToken,
    #[error("--metrics-token-file {0:?} holds the cluster token: give scrapers a secret of their own (it opens only the metrics)")]
    MetricsTokenIsClusterToken(PathBuf),
    #[error("--quota-file is the master's; this daemon runs no master")]
    QuotasOnAgent,
    #[error(
        "--etcd, --etcd-lease-secs and --etcd-prefix are the master's; this daemon runs no master"
    )]
    EtcdOnAgent,
    #[error(
        "--etcd-lease-secs and --etcd-prefix are about an election through etcd: pass --etcd too"
    )]
    LeaseWithoutEtcd,
    #[error("--etcd {0:?}: TLS to etcd is not supported; run etcd on a private network and give http:// URLs")]
    EtcdTls(String),
    #[error("a take-over would take up to {secs} s (the lease, plus the new leader's wait for agents), past the {limit} s callers wait: shorten --etcd-lease-secs or --heartbeat-ms")]
    TakeoverTooLong { secs: u64, limit: u64 },
    #[error("--etcd-prefix {0:?}: give 1 to 64 letters, digits, '-', '_' or '.'")]
    EtcdPrefix(String),
    #[error("--etcd {0:?}: give etcd members as http:// URLs, comma-separated")]
    EtcdUrl(String),
    #[error("--etcd-lease-secs {0}: give {MIN_LEASE_SECS} to {MAX_LEASE_SECS} seconds")]
    EtcdLease(u64),
    #[error("--join {0:?}: give the master as HOST:PORT, or several comma-separated")]
    Join(String),
    #[error(transparent)]
    Quotas(#[from] crate::quota_file::QuotaFileError),
    #[error("TLS needs all of --tls-cert, --tls-key and --tls-ca; missing {0}")]
    TlsPartial(&'static str),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("--heartbeat-ms must be between 50 and 60000")]
    Heartbeat,
    #[error(
        "need heartbeat < suspect-after < down-after; got {heartbeat} < {suspect} < {down} ms"
    )]
    Liveness {
        heartbeat: u64,
        suspect: u64,
        down: u64,
    },
}

/// The masters an agent joins: one HOST:PORT or several, comma-separated.
fn join_list(join: &str) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = join.split(',').map(|a| a.trim().to_string()).collect();
    let well_formed = |a: &String| {
        a.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        })
    };
    if list.iter().all(well_formed) {
        Ok(list)
    } else {
        Err(ConfigError::Join(join.to_string()))
    }
}

/// The master's election from `--etcd`, `--etcd-lease-secs` and
/// `--etcd-prefix`.
fn election(
    master: bool,
    etcd: Option<String>,
    lease: Option<u64>,
    prefix: Option<String>,
) -> Result<Option<Election>, ConfigError> {
    if !master {
        return match (etcd, lease, prefix) {
            (None, None, None) => Ok(None),
            _ => Err(ConfigError::EtcdOnAgent),
        };
    }
    let Some(urls) = etcd else {
        return match (lease, prefix) {
            (None, None) => Ok(None),
            _ => Err(ConfigError::LeaseWithoutEtcd),
        };
    };
    let list: Vec<String> = urls.split(',').map(|u| u.trim().to_string()).collect();
    if list.iter().any(|u| u.starts_with("https://")) {
        return Err(ConfigError::EtcdTls(urls));
    }
    let url = |u: &String| {
        u.strip_prefix("http://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace))
    };
    if !list.iter().all(url) {
        return Err(ConfigError::EtcdUrl(urls));
    }
    let secs = lease.unwrap_or(DEFAULT_LEASE_SECS);
    if !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&secs) {
        return Err(ConfigError::EtcdLease(secs));
    }
    let prefix = prefix.unwrap_or_else(|| "oncilla".to_string());
    // No '/': etcd elections range over `NAME/`, so nested prefixes
    // would see each other's candidates.
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if prefix.is_empty() || prefix.len() > 64 || !prefix.chars().all(allowed) {
        return Err(ConfigError::EtcdPrefix(prefix));
    }
    Ok(Some(Election {
        etcd: list,
        lease: std::time::Duration::from_secs(secs),
        prefix,
    }))
}

/// What one user's pulls may move into a node each second, unless
/// `--pull-rate` says otherwise: more than a TCP connection carries, so
/// only a user pulling on many connections at once meets it.
pub const DEFAULT_PULL_RATE: u64 = 2 << 30;

/// How long a session credential is good for, unless
/// `--credential-lifetime` says otherwise.
pub const DEFAULT_CREDENTIAL_LIFETIME: std::time::Duration = std::time::Duration::from_secs(300);
/// Bounds of `--credential-lifetime`, in seconds: renewals every third of
/// it must not flood a session, and a day is long enough for anything.
pub const MIN_CREDENTIAL_LIFETIME: u64 = 3;
pub const MAX_CREDENTIAL_LIFETIME: u64 = 86_400;

/// Bounds of `--etcd-lease-secs`: a renewal every third of the lease must
/// fit a slow etcd round trip, and a minute is the longest a cluster should
/// wait for a dead leader (and callers wait through a take-over for at
/// most `RECOVERY_WAIT`, 60 s).
pub const MIN_LEASE_SECS: u64 = 2;
pub const MAX_LEASE_SECS: u64 = 30;
/// The leader's lease unless `--etcd-lease-secs` says otherwise.
pub const DEFAULT_LEASE_SECS: u64 = 5;

/// How masters are elected, when they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    /// The etcd members' URLs.
    pub etcd: Vec<String>,
    /// The leader's lease.
    pub lease: std::time::Duration,
    /// The cluster's keys in etcd start with this.
    pub prefix: String,
}

/// The agent role's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The masters' addresses (one, or every standby's too).
    pub join: Vec<String>,
    pub data_listen: SocketAddr,
    pub socket: PathBuf,
    pub capacity: u64,
    /// The failure domain it declares (empty: none).
    pub zone: String,
    pub huge_pages: HugePages,
    /// Bytes a second one user may pull into this node (0: no limit).
    pub pull_rate: u64,
    /// How long a session credential given here is good for.
    pub credential_lifetime: std::time::Duration,
    /// `--rdma-device` selections; empty: every active port.
    pub rdma_devices: Vec<String>,
}

/// The merged, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub master: bool,
    pub agent: Option<AgentConfig>,
    pub name: String,
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    /// The cluster token: the master's (and an agent's started with it).
    pub token: Option<Token>,
    /// The agent's keys: loaded, or derived from the token for `name`.
    pub node_keys: Option<Arc<NodeKeys>>,
    pub liveness: Liveness,
    /// TLS on every TCP listener, and trust when dialling; `None`: plain TCP.
    pub tls: Option<Tls>,
    /// Where to serve metrics and the token scrapers present; `None`: off.
    pub metrics: Option<(SocketAddr, Token)>,
    /// The master's quota file and the quotas it held at start.
    pub quotas: Option<(PathBuf, Quotas)>,
    /// The master's election; `None`: it always leads.
    pub election: Option<Election>,
}

/// A daemon's TLS: what it serves and what it trusts.
#[derive(Debug, Clone)]
pub struct Tls {
    pub serve: ServerTls,
    pub trust: ClientTls,
}

impl Tls {
    fn load(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<Self>, ConfigError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(Self {
                serve: ServerTls::load(&cert, &key)?,
                trust: ClientTls::load(&ca)?,
            })),
            (None, _, _) => Err(ConfigError::TlsPartial("--tls-cert")),
            (_, None, _) => Err(ConfigError::TlsPartial("--tls-key")),
            (_, _, None) => Err(ConfigError::TlsPartial("--tls-ca")),
        }
    }
}

impl Config {
    /// Merges flags (and environment, which clap folds in) over the file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the setting at fault.
    pub fn load(cli: Cli) -> Result<Self, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let master = cli.master || file.master.unwrap_or(false);
        let join = cli.join.or(file.join);
        if !master && join.is_none() {
            return Err(ConfigError::NoRole);
        }
        let keys_file = cli.node_keys_file.or(file.node_keys_file);
        let token_value = cli.token.or(file.token);
        let token_file = cli.token_file.or(file.token_file);
        let token = match (&keys_file, &token_value, &token_file) {
            (Some(_), None, None) if master => return Err(ConfigError::MasterWithKeys),
            (Some(_), None, None) => None,
            _ => Some(
                Token::resolve(token_value.as_deref(), token_file.as_deref())?
                    .strong("cluster token")?,
            ),
        };
        let loaded = keys_file.as_deref().map(NodeKeys::load).transpose()?;
        let name = match (cli.name.or(file.name), &loaded) {
            (Some(name), Some(k)) if name != k.name() => {
                return Err(ConfigError::KeysName {
                    keys: k.name().to_string(),
                    name,
                })
            }
            (Some(name), _) => name,
            (None, Some(k)) => k.name().to_string(),
            (None, None) => hostname(),
        };
        let agent = match join {
            Some(join) => {
                let capacity = cli
                    .capacity
                    .or(file.capacity)
                    .ok_or(ConfigError::NoCapacity)?;
                Some(AgentConfig {
                    join: join_list(&join)?,
                    data_listen: cli
                        .data_listen
                        .or(file.data_listen)
                        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 7071))),
                    socket: cli
                        .socket
                        .or(file.socket)
                        .unwrap_or_else(|| PathBuf::from(oncilla_net::DEFAULT_SOCKET)),
                    capacity: parse_size(&capacity)?,
                    zone: match cli.zone.or(file.zone) {
                        Some(zone) => {
                            oncilla_model::node::check_zone(&zone).map_err(ConfigError::Zone)?;
                            zone
                        }
                        None => String::new(),
                    },
                    huge_pages: cli.hugepages.or(file.hugepages).unwrap_or_default(),
                    pull_rate: match cli.pull_rate.or(file.pull_rate) {
                        Some(rate) => parse_size(&rate).map_err(ConfigError::PullRate)?,
                        None => DEFAULT_PULL_RATE,
                    },
                    credential_lifetime: match cli.credential_lifetime.or(file.credential_lifetime)
                    {
                        Some(s)
                            if !(MIN_CREDENTIAL_LIFETIME..=MAX_CREDENTIAL_LIFETIME)
                                .contains(&s) =>
                        {
                            return Err(ConfigError::CredentialLifetime(s))
                        }
                        Some(s) => std::time::Duration::from_secs(s),
                        None => DEFAULT_CREDENTIAL_LIFETIME,
                    },
                    rdma_devices: if cli.rdma_device.is_empty() {
                        file.rdma_device.unwrap_or_default()
                    } else {
                        cli.rdma_device
                    },
                })
            }
            None => None,
        };
        let node_keys = match (loaded, &token, &agent) {
            (Some(k), _, _) => Some(Arc::new(k)),
            (None, Some(t), Some(_)) => Some(Arc::new(NodeKeys::derive(t, &name))),
            _ => None,
        };
        let heartbeat_ms = cli.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(1000);
        if !(50..=60_000).contains(&heartbeat_ms) {
            return Err(ConfigError::Heartbeat);
        }
        let defaults = Liveness::from_heartbeat(Duration::from_millis(heartbeat_ms));
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let suspect = cli
            .suspect_after_ms
            .or(file.suspect_after_ms)
            .unwrap_or(ms(defaults.suspect_after));
        let down = cli
            .down_after_ms
            .or(file.down_after_ms)
            .unwrap_or(ms(defaults.down_after));
        if !(heartbeat_ms < suspect && suspect < down) {
            return Err(ConfigError::Liveness {
                heartbeat: heartbeat_ms,
                suspect,
                down,
            });
        }
        let tls = Tls::load(
            cli.tls_cert.or(file.tls_cert),
            cli.tls_key.or(file.tls_key),
            cli.tls_ca.or(file.tls_ca),
        )?;
        let metrics = match (
            cli.metrics_listen.or(file.metrics_listen),
            cli.metrics_token_file.or(file.metrics_token_file),
        ) {
            (None, _) => None,
            (Some(_), None) => return Err(ConfigError::MetricsToken),
            (Some(addr), Some(path)) => {
                let t = Token::resolve(None, Some(&path))?.strong("metrics token")?;
                // A scraper's secret must open the metrics and nothing else.
                let cluster = match (&token, &node_keys) {
                    (Some(token), _) => token.matches(t.as_bytes()),
                    (None, Some(keys)) => matches!(
                        keys.authenticate(t.as_bytes()),
                        Some(oncilla_net::credential::Principal::Member)
                    ),
                    (None, None) => false,
                };
                if cluster {
                    return Err(ConfigError::MetricsTokenIsClusterToken(path));
                }
                Some((addr, t))
            }
        };
        let quotas = match cli.quota_file.or(file.quota_file) {
            Some(_) if !master => return Err(ConfigError::QuotasOnAgent),
            Some(path) => {
                let q = crate::quota_file::load(&path)?;
                Some((path, q))
            }
            None => None,
        };
        let election = election(
            master,
            cli.etcd.or(file.etcd),
            cli.etcd_lease_secs.or(file.etcd_lease_secs),
            cli.etcd_prefix.or(file.etcd_prefix),
        )?;
        let liveness = Liveness {
            heartbeat: Duration::from_millis(heartbeat_ms),
            suspect_after: Duration::from_millis(suspect),
            down_after: Duration::from_millis(down),
        };
        if let Some(e) = &election {
            // Callers wait through a take-over at most RECOVERY_WAIT.
            let takeover = e.lease + liveness.takeover_recovery();
            if takeover > oncilla_proto::client::RECOVERY_WAIT {
                return Err(ConfigError::TakeoverTooLong {
                    secs: takeover.as_secs(),
                    limit: oncilla_proto::client::RECOVERY_WAIT.as_secs(),
                });
            }
        }
        Ok(Self {
            tls,
            metrics,
            quotas,
            election,
            master,
            agent,
            node_keys,
            name,
            listen: cli.listen.or(file.listen).unwrap_or_else(|| {
                SocketAddr::from(([0, 0, 0, 0], oncilla_proto::DEFAULT_MASTER_PORT))
            }),
            advertise: cli.advertise.or(file.advertise),
            token,
            liveness,
        })
    }

    /// The merged settings as TOML (what `--check-config` prints): every
    /// setting with the value in force, secrets only as whether they are
    /// set.
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let mut s = String::from("# oncillad: merged configuration (flags > environment > file)\n");
        let q = |v: &str| format!("{v:?}");
        let mut line = |k: &str, v: String| {
            let _ = writeln!(s, "{k} = {v}");
        };
        line("master", self.master.to_string());
        line("name", q(&self.name));
        line("listen", q(&self.listen.to_string()));
        match &self.advertise {
            Some(a) => line("advertise", q(a)),
            None => line(
                "# advertise",
                q("(not set: the listen IP, or the host name)"),
            ),
        }
        if let Some(a) = &self.agent {
            line("join", q(&a.join.join(",")));
            line("data_listen", q(&a.data_listen.to_string()));
            line("socket", q(&a.socket.display().to_string()));
            line("capacity", q(&a.capacity.to_string()));
            if !a.zone.is_empty() {
                line("zone", q(&a.zone));
            }
            line(
                "hugepages",
                q(&format!("{:?}", a.huge_pages).to_lowercase()),
            );
            line("pull_rate", q(&a.pull_rate.to_string()));
            line(
                "credential_lifetime",
                a.credential_lifetime.as_secs().to_string(),
            );
            let devices: Vec<String> = a.rdma_devices.iter().map(|d| q(d)).collect();
            line("rdma_device", format!("[{}]", devices.join(", ")));
        }
        let secret = |set: bool| q(if set { "(set)" } else { "(not set)" });
        line("# token", secret(self.token.is_some()));
        line(
            "# node_keys",
            q(&self
                .node_keys
                .as_ref()
                .map_or("(none)".to_string(), |k| format!("(node {})", k.name()))),
        );
        line(
            "heartbeat_ms",
            self.liveness.heartbeat.as_millis().to_string(),
        );
        line(
            "suspect_after_ms",
            self.liveness.suspect_after.as_millis().to_string(),
        );
        line(
            "down_after_ms",
            self.liveness.down_after.as_millis().to_string(),
        );
        line("# tls", q(if self.tls.is_some() { "on" } else { "off" }));
        match &self.metrics {
            Some((addr, _)) => line("metrics_listen", q(&addr.to_string())),
            None => line("# metrics_listen", q("(off)")),
        }
        match &self.quotas {
            _ if !self.master => {}
            Some((path, q_)) => line(
                "quota_file",
                format!(
                    "{} # {} user quota(s)",
                    q(&path.display().to_string()),
                    q_.users.len()
                ),
            ),
            None => line("# quota_file", q("(none: quotas cannot be set)")),
        }
        match &self.election {
            _ if !self.master => {}
            Some(e) => {
                line("etcd", q(&e.etcd.join(",")));
                line("etcd_lease_secs", e.lease.as_secs().to_string());
                line("etcd_prefix", q(&e.prefix));
            }
            None => line("# etcd", q("(none: this master always leads)")),
        }
        s
    }

    /// The address peers should use for a socket bound at `bound`.
    pub fn advertised(&self, bound: SocketAddr) -> String {
        let host = match &self.advertise {
            Some(h) => h.clone(),
            None if bound.ip().is_unspecified() => hostname(),
            None => bound.ip().to_string(),
        };
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{}", bound.port())
        } else {
            format!("{host}:{}", bound.port())
        }
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        source,
    })
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests;
