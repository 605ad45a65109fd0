//! A node as the master knows it: what it offers and holds, when it was
//! last heard from and when it came up (`Seen`, judged against the
//! `Liveness` thresholds by pure time arithmetic), and its sessions as of
//! its registration. Plain data for the table (`state`), the liveness
//! loop (`liveness`) and re-registration (`recovery`); it imports none of
//! them, so they never import each other for a type.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oncilla_model::node::{NodeInfo, NodeState, PoolUsage};
use oncilla_model::size::round_up;

/// Deadline of an agent's heartbeat to the master: a master silent this
/// long is passed over for the next one (with standby masters).
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(2);

/// The master's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How often agents heartbeat.
    pub heartbeat: Duration,
    /// Silence after which a node is `suspect` (gets no new memory).
    pub suspect_after: Duration,
    /// Silence after which a node is `down` (its allocations are degraded).
    pub down_after: Duration,
}

impl Liveness {
    /// Thresholds of three and five heartbeats.
    pub fn from_heartbeat(heartbeat: Duration) -> Self {
        Self {
            heartbeat,
            suspect_after: heartbeat * 3,
            down_after: heartbeat * 5,
        }
    }

    /// How long a restarted master waits for agents to re-register before
    /// it changes the table: every live agent heartbeats (and learns it
    /// must register) well within this.
    pub fn recovery(&self) -> Duration {
        self.suspect_after
    }

    /// How long a master elected to take over waits for agents before it
    /// changes the table: [`Liveness::recovery`], plus the time an agent
    /// needs to give up on a leader that went silent (its heartbeat's
    /// deadline, [`HEARTBEAT_DEADLINE`]) and one more heartbeat. A killed
    /// leader refuses connections at once; a cut-off or frozen one does
    /// not, and agents must still reach the new leader in its window.
    pub fn takeover_recovery(&self) -> Duration {
        self.recovery() + HEARTBEAT_DEADLINE + self.heartbeat
    }
}

/// When a node was last heard from and when it last came up.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub last: Instant,
    /// Unix ms at which the node (re)registered or came back from silence.
    pub up_since_ms: u64,
}

impl Seen {
    pub fn now() -> Self {
        Self {
            last: Instant::now(),
            up_since_ms: unix_ms(),
        }
    }

    /// The node's state and the unix ms at which it entered it.
    pub fn state(&self, l: &Liveness) -> (NodeState, u64) {
        let silent = self.last.elapsed();
        let at = |threshold: Duration| {
            let ago = silent.saturating_sub(threshold);
            unix_ms().saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX))
        };
        if silent > l.down_after {
            (NodeState::Down, at(l.down_after))
        } else if silent > l.suspect_after {
            (NodeState::Suspect, at(l.suspect_after))
        } else {
            (NodeState::Up, self.up_since_ms)
        }
    }

    /// Records a heartbeat; returns the state the node was in before it.
    pub fn heard(&mut self, l: &Liveness) -> NodeState {
        let (before, _) = self.state(l);
        if before != NodeState::Up {
            self.up_since_ms = unix_ms();
        }
        self.last = Instant::now();
        before
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Sessions of a node as of its registration.
#[derive(Debug, Default)]
pub(crate) struct SessionsSeen {
    /// Sessions numbered below this were opened before the registration...
    pub next_seq: u64,
    /// ...and of those, these are still open.
    pub live: BTreeSet<String>,
}

/// A registered node.
pub(crate) struct Node {
    pub info: NodeInfo,
    /// The agent's current start (a new one holds nothing from before).
    pub incarnation: u64,
    /// Bytes reserved on the node by allocations (page-rounded).
    pub reserved: u64,
    /// The pool as the node last reported it.
    pub pool: PoolUsage,
    pub seen: Seen,
    /// The state last logged, to log each change once.
    pub logged: NodeState,
    /// Its sessions as of its registration, less those ended since.
    pub sessions: SessionsSeen,
    /// Its next heartbeat should list every id it holds: it was heard
    /// again (by a session's call) after it had gone quiet, and copies may
    /// have been dropped meanwhile.
    pub full_due: bool,
    /// Being drained (`ocmctl drain`): nothing new is placed here, and
    /// what it holds moves to other nodes.
    pub draining: bool,
    /// Why the last move off it could not be made (empty: none failed).
    pub drain_note: String,
}

impl Node {
    /// Bytes an extent of `len` takes on this node.
    pub fn footprint(&self, len: u64) -> u64 {
        round_up(len, self.info.page())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_turns_suspect_then_down_and_a_heartbeat_brings_it_back() {
        // Thresholds far above a stall of a loaded machine between two
        // lines.
        let l = Liveness {
            heartbeat: Duration::from_millis(10),
            suspect_after: Duration::from_millis(200),
            down_after: Duration::from_millis(600),
        };
        let mut s = Seen::now();
        let registered = s.up_since_ms;
        assert_eq!(s.state(&l), (NodeState::Up, registered));
        s.last = Instant::now() - Duration::from_millis(300);
        let (state, since) = s.state(&l);
        assert_eq!(state, NodeState::Suspect);
        // Suspect since about 100 ms ago.
        assert!((unix_ms() - since).abs_diff(100) < 250, "{since}");
        s.last = Instant::now() - Duration::from_millis(1000);
        assert_eq!(s.state(&l).0, NodeState::Down);
        assert_eq!(s.heard(&l), NodeState::Down);
        assert_eq!(s.state(&l).0, NodeState::Up);
        assert!(s.up_since_ms >= registered);
        assert_eq!(
            Liveness::from_heartbeat(l.heartbeat).down_after,
            l.heartbeat * 5
        );
    }
}
