//! Whether this daemon is ready, published in one place. Each role says
//! so itself (the master: its recovery window is over and it changes its
//! table; the agent: the master knows it); this module publishes what
//! they say on the gRPC health service (`grpc.health.v1`: `""` for the
//! whole daemon, `oncilla.v1.Master` and `oncilla.v1.Agent` for the roles)
//! and tells systemd the first time every role is ready (`READY=1` on
//! `$NOTIFY_SOCKET`, for `Type=notify`). It never decides readiness.

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use oncilla_proto::health::{AGENT, MASTER};

use crate::master::seat::Seat;

/// Publishes the roles' readiness (`None`: the role does not run here)
/// until the daemon stops.
pub async fn publish(
    reporter: HealthReporter,
    mut master: Option<watch::Receiver<bool>>,
    mut agent: Option<watch::Receiver<bool>>,
) {
    let mut told_systemd = false;
    // A role whose sender is gone keeps its last word.
    let (mut master_open, mut agent_open) = (master.is_some(), agent.is_some());
    loop {
        let now = |r: &Option<watch::Receiver<bool>>| r.as_ref().map(|r| *r.borrow());
        let (m, a) = (now(&master), now(&agent));
        for (name, state) in [(MASTER, m), (AGENT, a)] {
            if let Some(ready) = state {
                reporter.set_service_status(name, status(ready)).await;
            }
        }
        let all = m.unwrap_or(true) && a.unwrap_or(true);
        reporter.set_service_status("", status(all)).await;
        if all && !told_systemd {
            told_systemd = true;
            notify_systemd();
        }
        // Whichever role changes next.
        tokio::select! {
            open = changed(master.as_mut()), if master_open => master_open = open,
            open = changed(agent.as_mut()), if agent_open => agent_open = open,
            else => return,
        }
    }
}

/// Waits for `r` to change; false when its sender is gone (or there is
/// none).
async fn changed(r: Option<&mut watch::Receiver<bool>>) -> bool {
    match r {
        Some(r) => r.changed().await.is_ok(),
        None => false,
    }
}

fn status(ready: bool) -> ServingStatus {
    if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Says whether the master role is ready: this daemon leads (always,
/// without an election) and its core's recovery window is over. Follows
/// `seat` as it changes.
pub async fn master_ready<L: crate::master::AgentLink>(
    mut seat: watch::Receiver<Seat<L>>,
    ready: watch::Sender<bool>,
) {
    loop {
        let core = seat.borrow_and_update().core().ok();
        let left = core.as_ref().map(|c| c.recovering());
        ready.send_replace(left.is_some_and(|l| l.is_zero()));
        let open = match left {
            Some(l) if !l.is_zero() => tokio::select! {
                () = tokio::time::sleep(l) => true,
                r = seat.changed() => r.is_ok(),
            },
            _ => seat.changed().await.is_ok(),
        };
        if !open {
            // The seat never changes again: only a recovery may be left.
            let core = seat.borrow().core().ok();
            if let Some(core) = core {
                tokio::time::sleep(core.recovering()).await;
                ready.send_replace(true);
            }
            return;
        }
    }
}

/// `READY=1` to systemd's notification socket, where there is one (a
/// path, or `@name` in the abstract namespace). Best effort: a daemon not
/// started by systemd has none.
fn notify_systemd() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::ffi::OsStrExt;
        let sock = std::os::unix::net::UnixDatagram::unbound()?;
        let bytes = path.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name)?,
            None => std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(&path))?,
        };
        sock.send_to_addr(b"READY=1\nSTATUS=serving", &addr)?;
        Ok(())
    })();
    match sent {
        Ok(()) => tracing::info!("told systemd the daemon is ready"),
        Err(e) => tracing::warn!(error = %e, "cannot notify systemd ($NOTIFY_SOCKET)"),
    }
}
