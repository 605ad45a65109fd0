//! Copies that wait out a lost node or a move: an allocation's copies as
//! the master last described them, looked up again when a copy fails as a
//! lost node or a move off a drained node makes it fail, and the copy
//! tried again there, for up to [`FAILOVER_WAIT`]. A replicated
//! allocation goes through it from the start; one with a single copy
//! once a failure shows it moves or moved. Shared by an allocation's
//! handle and the batches it is in.
//!
//! It routes copies as `route` decides for what the master describes,
//! and only ever repeats the caller's own copy (a write that failed was
//! never acknowledged: writing the same bytes again is harmless).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use oncilla_model::alloc::Allocation as Record;

use crate::client::Client;
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::fabric::tcp::IoBuf;
use crate::fabric::{Target, Transfer};
use crate::route::{self, Route};
use crate::spec::Fabric;

/// An allocation's way through a loss or a move.
pub(crate) struct Failover {
    client: Arc<Client>,
    id: u64,
    /// The fabric preference the allocation was opened with.
    fabric: Fabric,
    /// Where its primary was when it was opened.
    opened: Placed,
    /// Its copies as the master last described them: writes go to the
    /// primary, whose agent copies them on; reads to the nearest copy.
    /// Set at opening for a replicated allocation; for one copy once it
    /// is found to move or have moved (its node is drained).
    copies: OnceLock<Copies>,
}

impl Failover {
    /// The way through for `record`, opened with `fabric`.
    ///
    /// # Errors
    /// A replicated record whose copies cannot be routed.
    pub(crate) fn open(client: &Arc<Client>, record: &Record, fabric: Fabric) -> Result<Self> {
        let copies = OnceLock::new();
        // By what was asked, not by the copies there are now: one
        // opened while its lost copies are being re-created is still
        // looked up again through a loss.
        if record.placement.copies() > 1 {
            let layout = Layout::of(record, client, fabric)?;
            let _ = copies.set(Copies {
                fabric,
                now: Mutex::new(Arc::new(layout)),
            });
        }
        Ok(Self {
            client: Arc::clone(client),
            id: record.id,
            fabric,
            opened: placed(record),
            copies,
        })
    }

    /// Writes `src` at `offset`: by `direct` (the route the handle was
    /// opened with) while the allocation has one copy where it was, else
    /// through its primary, waiting out a loss or a move for up to `wait`
    /// ([`FAILOVER_WAIT`] but where the caller has a bound of its own).
    pub(crate) fn write(
        &self,
        offset: u64,
        src: &[u8],
        wait: Duration,
        direct: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        if self.copies.get().is_none() {
            match direct(src) {
                Err(e) if self.moved(&e) => {}
                done => return done,
            }
        }
        self.through_failover(wait, |layout| {
            self.client.data.run([Transfer {
                target: layout.primary.target(),
                offset,
                buf: IoBuf::Write(src),
            }])
        })
    }

    /// Reads into `dst` from `offset`: as [`Failover::write`], from the
    /// copy with the most bytes on this node (the primary on a tie), and
    /// from the next when a node cannot be reached or fails the read.
    pub(crate) fn read(
        &self,
        offset: u64,
        dst: &mut [u8],
        wait: Duration,
        direct: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if self.copies.get().is_none() {
            match direct(&mut *dst) {
                Err(e) if self.moved(&e) => {}
                done => return done,
            }
        }
        self.through_failover(wait, |layout| {
            let last = layout.reads.len() - 1;
            for (i, copy) in layout.reads.iter().enumerate() {
                let read = self.client.data.run([Transfer {
                    target: copy.target(),
                    offset,
                    buf: IoBuf::Read(&mut *dst),
                }]);
                match read {
                    Err(e) if i < last && fails_over(&e) => {
                        tracing::debug!(alloc_id = self.id, error = %e, "read failed on one copy; reading another");
                    }
                    done => return done,
                }
            }
            Ok(())
        })
    }

    /// Runs `attempt` on the copies as last described; while it fails as a
    /// lost node makes it fail, looks the allocation up again (pausing
    /// 20 ms, doubling to 500 ms) and retries on what the master says
    /// now, for up to `wait`. Writing the same bytes again is harmless: a
    /// failed write was never acknowledged.
    fn through_failover(
        &self,
        wait: Duration,
        mut attempt: impl FnMut(&Layout) -> Result<()>,
    ) -> Result<()> {
        let Some(copies) = self.copies.get() else {
            return Err(Error::Internal(format!(
                "allocation {} has no copies to fail over to",
                self.id
            )));
        };
        let deadline = Instant::now() + wait;
        let mut pause = FAILOVER_PAUSE;
        loop {
            let layout = Arc::clone(&copies.now.lock().unwrap_or_else(PoisonError::into_inner));
            let error = match attempt(&layout) {
                Err(e) if may_succeed_later(&e) => e,
                done => return done,
            };
            if Instant::now() + pause > deadline {
                return Err(error);
            }
            tracing::debug!(alloc_id = self.id, error = %error, "a copy failed; looking the allocation up again");
            std::thread::sleep(pause);
            pause = (pause * 2).min(FAILOVER_PAUSE_MAX);
            let looked_up = self.client.lookup(self.id).and_then(|record| {
                Layout::of(&record, &self.client, fabric_for(&record, copies.fabric))
            });
            match looked_up {
                // One copy, not moving, where it failed: nothing to wait
                // for (a lost allocation, a failed node).
                Ok(new) if new.settled && new.placed == layout.placed => return Err(error),
                Ok(new) => {
                    *copies.now.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(new);
                }
                // Freed: the copy's own failure says so.
                Err(Error::NotFound(_)) => return Err(error),
                // The master out of reach, or a share with no whole copy
                // yet: the next round asks again.
                Err(e) => {
                    tracing::debug!(alloc_id = self.id, error = %e, "no usable description of the allocation yet; retrying as it was")
                }
            }
        }
    }

    /// Whether the master has described the allocation's primary elsewhere
    /// than where it was when opened (a promoted replica, a move): copies
    /// planned from the opening's description would miss it.
    pub(crate) fn rerouted(&self) -> bool {
        self.copies.get().is_some_and(|c| {
            c.now.lock().unwrap_or_else(PoisonError::into_inner).placed != self.opened
        })
    }

    /// Whether a single-copy allocation's copy failed with `e` because the
    /// allocation moves or moved (its node is drained): when the master
    /// says it is moving (from its planning until its new node is told
    /// it took over; its old node's RDMA keys are revoked, so it is copied
    /// over TCP meanwhile), or is elsewhere now (or no longer reached over
    /// RDMA), it is copied through [`Self::through_failover`] from now on.
    /// Otherwise (a lost allocation, a node that failed with it in place)
    /// the error is the caller's, at once.
    fn moved(&self, e: &Error) -> bool {
        if !may_succeed_later(e) {
            return false;
        }
        let Ok(record) = self.client.lookup(self.id) else {
            return false;
        };
        if !record.moving && placed(&record) == self.opened {
            return false;
        }
        let Ok(layout) = Layout::of(&record, &self.client, fabric_for(&record, self.fabric)) else {
            return false;
        };
        tracing::debug!(alloc_id = self.id, error = %e, "the allocation moves or moved; copying where the master says it is");
        let _ = self.copies.set(Copies {
            fabric: self.fabric,
            now: Mutex::new(Arc::new(layout)),
        });
        true
    }
}

/// How long a copy to or from a replicated allocation waits for the
/// cluster to get over a lost node (the master's failure detection, five
/// heartbeats, then a replica promoted or the lost copy dropped) before it
/// returns the failure to the caller.
pub(crate) const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// The first pause between looking the allocation up again; it doubles up
/// to [`FAILOVER_PAUSE_MAX`].
const FAILOVER_PAUSE: Duration = Duration::from_millis(20);
const FAILOVER_PAUSE_MAX: Duration = Duration::from_millis(500);

/// A replicated allocation's copies, swapped for the master's newer
/// description when a copy fails.
struct Copies {
    fabric: Fabric,
    now: Mutex<Arc<Layout>>,
}

/// Where a record puts its primary's bytes and whether RDMA reaches
/// them: a single copy that fails where this did not change, and is not
/// moving, failed for good.
type Placed = Vec<(String, u64, u64, bool)>;

fn placed(record: &Record) -> Placed {
    record
        .extents
        .iter()
        .map(|e| {
            (
                e.node.clone(),
                e.alloc_offset,
                e.pool_offset,
                e.rdma.is_empty(),
            )
        })
        .collect()
}

/// Where a replicated (or moved) allocation's copies are.
struct Layout {
    /// The record's primary as [`placed`] says, and whether it has one
    /// copy and is not moving (then a failure there is the caller's).
    placed: Placed,
    settled: bool,
    /// Takes every write.
    primary: Copy,
    /// Every whole copy in the order reads try them: the most bytes on
    /// this node first, the primary first among equals.
    reads: Vec<Copy>,
}

/// One copy of a replicated (or moved) allocation's bytes, never through
/// a mapping: replicated memory is never mapped, and a moved allocation's
/// new node is reached as another node is.
struct Copy {
    desc: Arc<Descriptor>,
    routes: Arc<[Route]>,
}

impl Copy {
    /// Copy `copy` of `record` (0: the primary), routed for `fabric`.
    fn of(record: &Record, copy: u32, client: &Client, fabric: Fabric) -> Result<Self> {
        let mut r = record.clone();
        r.extents = record.copy_extents(copy).cloned().collect();
        r.replicas.clear();
        let desc = Descriptor::from_record(r)?;
        let data = &client.data;
        let routes: Vec<Route> =
            route::decide_all(&desc.extents, &client.node, fabric, |e| data.rdma_for(e))?
                .into_iter()
                .map(|r| if r == Route::Mapped { Route::Tcp } else { r })
                .collect();
        Ok(Copy {
            desc: Arc::new(desc),
            routes: routes.into(),
        })
    }

    fn target(&self) -> Target<'_> {
        Target {
            desc: &self.desc,
            routes: &self.routes,
            local: None,
        }
    }

    /// Its bytes on node `me`.
    fn bytes_on(&self, me: &str) -> u64 {
        self.desc
            .extents
            .iter()
            .filter(|e| e.node == me)
            .map(|e| e.len)
            .sum()
    }
}

impl Layout {
    /// The copies `record` describes. A replica still being re-created
    /// (not yet whole) is left out of the reads.
    fn of(record: &Record, client: &Client, fabric: Fabric) -> Result<Self> {
        let primary = Copy::of(record, 0, client, fabric)?;
        let mut reads = vec![Copy {
            desc: Arc::clone(&primary.desc),
            routes: Arc::clone(&primary.routes),
        }];
        for copy in record.replica_copies() {
            match Copy::of(record, copy, client, fabric) {
                Ok(c) => reads.push(c),
                Err(e) => {
                    tracing::debug!(alloc_id = record.id, copy, error = %e, "a copy is not whole: not read from")
                }
            }
        }
        // A stable sort: the primary stays first among equals.
        reads.sort_by_cached_key(|c| std::cmp::Reverse(c.bytes_on(&client.node)));
        Ok(Layout {
            placed: placed(record),
            settled: record.placement.copies() == 1 && !record.moving,
            primary,
            reads,
        })
    }
}

/// The fabric to reach `record`'s copies with: TCP while it moves off a
/// drained node (its agent revoked its RDMA keys), else `asked`.
fn fabric_for(record: &Record, asked: Fabric) -> Fabric {
    if record.moving {
        Fabric::Tcp
    } else {
        asked
    }
}

/// Whether a read that failed so may succeed from another copy: the node
/// could not be reached or failed, not the request itself.
fn fails_over(e: &Error) -> bool {
    matches!(
        e,
        Error::NodeUnreachable { .. }
            | Error::Fabric { .. }
            | Error::NodeDown(_)
            | Error::Unavailable(_)
            | Error::Internal(_)
    )
}

/// Whether a copy that failed so may succeed once the master has acted
/// (a lost node, a move): as [`fails_over`], or the node no longer holds
/// the allocation.
pub(crate) fn may_succeed_later(e: &Error) -> bool {
    fails_over(e) || matches!(e, Error::NotFound(_))
}
