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

/// The master role's readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterReady {
    /// Starting, or leading but still in its recovery window.
    NotYet,
    /// Standing by (elected masters): started and doing its part, but not
    /// the master that serves (`oncilla.v1.Master` stays NOT_SERVING).
    Standby,
    /// Leading, past its recovery window.
    Serving,
}

/// Publishes the roles' readiness (`None`: the role does not run here)
/// until the daemon stops. A standby master counts as started for the
/// whole daemon (`""`, systemd) and as not serving for its role.
pub async fn publish(
    reporter: HealthReporter,
    mut master: Option<watch::Receiver<MasterReady>>,
    mut agent: Option<watch::Receiver<bool>>,
) {
    let mut told_systemd = false;
    // A role whose sender is gone keeps its last word.
    let (mut master_open, mut agent_open) = (master.is_some(), agent.is_some());
    loop {
        let m = master.as_ref().map(|r| *r.borrow());
        let a = agent.as_ref().map(|r| *r.borrow());
        let serving = m.map(|m| m == MasterReady::Serving);
        for (name, state) in [(MASTER, serving), (AGENT, a)] {
            if let Some(ready) = state {
                reporter.set_service_status(name, status(ready)).await;
            }
        }
        let all = m.is_none_or(|m| m != MasterReady::NotYet) && a.unwrap_or(true);
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
async fn changed<T>(r: Option<&mut watch::Receiver<T>>) -> bool {
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
/// without an election) and its core's recovery window is over, or it
/// stands by. Follows `seat` as it changes.
pub async fn master_ready<L: crate::master::AgentLink>(
    mut seat: watch::Receiver<Seat<L>>,
    ready: watch::Sender<MasterReady>,
) {
    loop {
        let (core, standby) = {
            let s = seat.borrow_and_update();
            (
                s.core().ok().map(|(c, _)| c),
                matches!(*s, Seat::Standby { .. }),
            )
        };
        let left = core.as_ref().map(|c| c.recovering());
        ready.send_replace(match left {
            Some(l) if l.is_zero() => MasterReady::Serving,
            None if standby => MasterReady::Standby,
            _ => MasterReady::NotYet,
        });
        let open = match left {
            Some(l) if !l.is_zero() => tokio::select! {
                () = tokio::time::sleep(l) => true,
                r = seat.changed() => r.is_ok(),
            },
            _ => seat.changed().await.is_ok(),
        };
        if !open {
            // The seat never changes again: only a recovery may be left.
            let core = seat.borrow().core().ok().map(|(c, _)| c);
            if let Some(core) = core {
                tokio::time::sleep(core.recovering()).await;
                ready.send_replace(MasterReady::Serving);
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
