//! A cluster for the length of one piece of work (`ocmctl demo`, `ocmctl
//! run`, the benchmarks): started, handed to the work on its own thread
//! (liboncilla blocks), and stopped when the work returns or Ctrl-C or
//! SIGTERM arrives. With [`crate::Config::keep`], a successful run leaves
//! the cluster up and prints how to use and stop it.
//!
//! It owns the signal handling around the work; it never looks at what the
//! work does.

use oncilla_model::size::{parse_size, HumanBytes};

use crate::config::Config;
use crate::error::ClusterError;
use crate::launcher::{Cluster, Handle};

/// Starts the cluster `config` describes, says so on stderr, runs `work`
/// against it on its own thread, and stops everything when it returns or
/// a signal arrives.
///
/// # Errors
/// Daemons that fail to start (with their log's last lines), signals, and
/// whatever `work` returns.
pub fn run<T, E>(
    config: Config,
    work: impl FnOnce(&Handle) -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<ClusterError> + Send + 'static,
{
    let keep = config.keep;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ClusterError::Setup {
            what: "runtime",
            source,
        })?;
    // Signal handlers go in before any child exists, so no signal can leave one behind.
    let (mut int, mut term) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(i), Ok(t)) => (i, t),
            _ => return Err(ClusterError::Signals.into()),
        }
    };

    let caps: Vec<String> = config
        .capacities
        .iter()
        .map(|c| parse_size(c).map_or_else(|_| c.clone(), |b| HumanBytes(b).to_string()))
        .collect();
    let mut cluster = Cluster::start(config)?;
    eprintln!(
        "started a master and {} agents ({}) in {}\n",
        cluster.agents,
        caps.join(", "),
        cluster.dir.display()
    );
    let handle = cluster.handle();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("cluster-work".into())
        .spawn(move || {
            let _ = tx.send(work(&handle));
        })
        .map_err(|source| ClusterError::Setup {
            what: "work thread",
            source,
        })?;
    let outcome = rt.block_on(async {
        tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(ClusterError::WorkDied.into())),
            _ = int.recv() => Err(ClusterError::Interrupted.into()),
            _ = term.recv() => Err(ClusterError::Terminated.into()),
        }
    });
    match outcome {
        Ok(v) if keep => {
            detach(cluster);
            Ok(v)
        }
        other => {
            cluster.shutdown();
            other
        }
    }
}

/// Leaves the daemons running and says how to use and stop them.
fn detach(cluster: Cluster) {
    let (master, socket, token, dir) = (
        cluster.master_addr.clone(),
        cluster.socket(0),
        cluster.token_file(),
        cluster.dir.clone(),
    );
    let pids: Vec<String> = cluster
        .detach()
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    println!("\nthe cluster keeps running; to use it:");
    println!("  export ONCILLA_MASTER={master}");
    println!("  export ONCILLA_SOCKET={}", socket.display());
    println!("  export ONCILLA_TOKEN_FILE={}", token.display());
    println!("to stop it:");
    println!("  kill {} && rm -rf {}", pids.join(" "), dir.display());
}
