//! Allocating: plan where the bytes go, reserve them on every agent at
//! once, then commit the record, or roll every reservation back. Requests
//! arrive checked (`AllocateRequest`); this module decides, it never
//! parses.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use oncilla_model::alloc::{Allocation, Extent, Invalid, KEY_LEN, MAX_EXTENTS, MAX_ID};
use oncilla_model::cluster::{AllocateRequest, Piece, Range, Reservation, Reserved};
use oncilla_model::fabric::{self, Memory, Rdma};
use oncilla_model::quota::{self, Charge};
use oncilla_model::{Fabric, Kind};

use super::node::unix_ms;
use super::placement::{self, Planned};
use super::state::{Record, State, Target};
use super::{AgentLink, Master};
use crate::error::{CoreError, LinkError};

impl<L: AgentLink> Master<L> {
    /// Places, reserves and records a new allocation.
    ///
    /// # Errors
    /// Taken names, unknown/down nodes, exhausted capacity, a fabric the
    /// creator asked for that cannot reach a node, a master still
    /// recovering, and agents that fail to reserve (whatever was reserved
    /// is released again).
    pub async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, CoreError> {
        self.check_serving()?;
        let key: [u8; KEY_LEN] = rand::random();
        let persistent = req.persistent();
        let AllocateRequest {
            spec,
            origin_node,
            requester,
        } = req;
        let user = requester.as_ref().and_then(|r| r.uid);
        let (owner, creator) = match requester {
            Some(r) if persistent => (None, Some(r)),
            requester => (requester, None),
        };
        // What every holder keeps, so a restarted master can rebuild it.
        let mut alloc = Allocation::new(0, spec.size, spec.kind);
        alloc.owner = owner;
        alloc.user = user;
        alloc.shared = spec.shared;
        alloc.created_unix_ms = unix_ms();
        alloc.name = spec.name.clone();
        alloc.placement = spec.placement.clone();
        alloc.origin_node = origin_node.clone();

        let (id, targets, fabrics, charge, shares) = {
            let mut st = self.lock();
            if let Some(&taken) = st.names.get(&spec.name) {
                return Err(CoreError::NameTaken(spec.name, taken));
            }
            let candidates = self.candidates(&st);
            let primary = placement::plan(
                &placement::Request {
                    size: spec.size,
                    kind: spec.kind,
                    placement: &spec.placement,
                    origin: &origin_node,
                },
                &candidates,
            )?;
            let replicas = placement::replicas(&primary, spec.placement.copies(), &candidates)?;
            // Every write of a replicated allocation goes through its
            // primary's agent, which copies it on: TCP (the spec refused
            // the other fabrics).
            let preference = if replicas.is_empty() {
                spec.fabric
            } else {
                Fabric::Tcp
            };
            let shares = primary.len();
            let plan: Vec<Planned> = primary
                .into_iter()
                .chain(replicas.into_iter().flatten())
                .collect();
            let fabrics = plan
                .iter()
                .map(|p| creator_fabric(&st, p, spec.kind, &origin_node, preference))
                .collect::<Result<Vec<_>, _>>()?;
            if st.next_id > MAX_ID {
                // Never wraps: an id is never used twice.
                return Err(CoreError::CapacityExhausted {
                    requested: spec.size,
                    detail: format!("allocation ids are used up (the last is {MAX_ID})"),
                });
            }
            // The user's quota, with what is being reserved counted too,
            // so concurrent requests cannot pass it together.
            let charge = user.map(|uid| {
                let bytes = spec.size.saturating_mul(u64::from(spec.placement.copies()));
                (uid, plan_charge(&plan, bytes, persistent))
            });
            if let Some((uid, c)) = &charge {
                let usage = st.usage.get(uid).cloned().unwrap_or_default();
                quota::check(*uid, st.quotas.of(*uid), &usage, c)?;
            }
            let targets = hold(&mut st, plan)?;
            if let Some((uid, c)) = &charge {
                st.charge(*uid, c, true);
            }
            let id = self.take_id(&mut st);
            alloc.id = id;
            if !spec.name.is_empty() {
                // Held from now on, so a concurrent request cannot take it.
                st.names.insert(spec.name.clone(), id);
            }
            (id, targets, fabrics, charge, shares)
        };
        let mut unwind = Unwind {
            master: self,
            id,
            name: &spec.name,
            targets: &targets,
            charge: charge.as_ref(),
            committed: false,
        };

        // Target `i` holds copy `i / shares` of the primary share `i % shares`.
        let copy_of = |i: usize| u32::try_from(i / shares.max(1)).unwrap_or(u32::MAX);
        let replicas_of = |i: usize| -> Vec<String> {
            if i >= shares {
                return Vec::new();
            }
            targets
                .iter()
                .skip(shares + i)
                .step_by(shares.max(1))
                .map(|(_, _, data)| data.clone())
                .collect()
        };
        let reserves =
            targets
                .iter()
                .zip(&fabrics)
                .enumerate()
                .map(|(i, ((p, addr, _), fabric))| {
                    self.link.reserve(
                        addr,
                        Reservation {
                            alloc_id: id,
                            access_key: key.to_vec(),
                            ranges: p
                                .ranges
                                .iter()
                                .map(|&(alloc_offset, len)| Range { alloc_offset, len })
                                .collect(),
                            record: alloc.clone(),
                            fabric: *fabric,
                            gpu: p.gpu,
                            copy: copy_of(i),
                            replicas: replicas_of(i),
                        },
                    )
                });
        let results = join_all(reserves).await;
        self.note_pools(&results, &targets);
        let results: Vec<Result<Vec<Piece>, LinkError>> = results
            .into_iter()
            .zip(&targets)
            .map(|(r, (p, _, _))| r.and_then(|reply| check_pieces(p, reply.pieces)))
            .collect();
        if let Some((i, err)) = results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e.clone())))
        {
            let failed = targets[i].0.node.clone();
            tracing::warn!(alloc_id = id, node = %failed, error = %err, "reserve failed; rolling back");
            self.release_all(id, &targets).await;
            return Err(CoreError::Agent {
                node: failed,
                source: err,
            });
        }

        for (i, (((p, agent, data), r), fabric)) in
            targets.iter().zip(results).zip(&fabrics).enumerate()
        {
            let copy = copy_of(i);
            let into = if copy == 0 {
                &mut alloc.extents
            } else {
                &mut alloc.replicas
            };
            into.extend(r.unwrap_or_default().into_iter().map(|piece| Extent {
                node: p.node.clone(),
                alloc_offset: piece.alloc_offset,
                len: piece.len,
                pool_offset: piece.pool_offset,
                data_addr: data.clone(),
                // An agent whose HCA refused the registration returns no
                // region: `auto` then reaches the piece over TCP.
                fabric: if *fabric == Fabric::Verbs
                    && piece.rdma.is_empty()
                    && spec.fabric == Fabric::Auto
                {
                    Fabric::Tcp
                } else {
                    *fabric
                },
                agent_addr: agent.clone(),
                gpu: p.gpu,
                rdma: piece.rdma,
                copy,
            }));
        }
        alloc.extents.sort_by_key(|e| e.alloc_offset);
        alloc.replicas.sort_by_key(|e| (e.copy, e.alloc_offset));
        if alloc.extents.len() + alloc.replicas.len() > MAX_EXTENTS {
            // The pools were too fragmented to give the planned ranges in
            // few enough pieces: no message could carry the record.
            let extents = alloc.extents.len() + alloc.replicas.len();
            tracing::warn!(
                alloc_id = id,
                extents,
                "reserved in too many pieces; rolling back"
            );
            self.release_all(id, &targets).await;
            return Err(Invalid::Extents(extents).into());
        }
        alloc.access_key = key.to_vec();
        tracing::info!(
            alloc_id = id,
            size = spec.size,
            name = %alloc.name,
            nodes = targets.len(),
            extents = alloc.extents.len(),
            "allocated"
        );
        // Nothing fails from here on: the record takes over.
        unwind.committed = true;
        let mut st = self.lock();
        st.reserving.remove(&id);
        st.unreserve_gpus(&targets);
        if let Some(who) = creator {
            st.attach_session(who, id);
        }
        // Counted against its user when it was planned.
        st.insert(
            Record {
                alloc,
                lost: BTreeMap::new(),
                adopted: false,
            },
            true,
        );
        self.view(&st, id)
    }

    /// A fresh id (the caller checked it is at most [`MAX_ID`]), never
    /// used before by this master or any allocation an agent reported to
    /// it, marked as being reserved.
    fn take_id(&self, st: &mut State) -> u64 {
        let id = st.next_id;
        st.next_id = id.saturating_add(1);
        st.reserving.insert(id);
        id
    }

    /// Records the pool usage the agents reported with their reservations.
    fn note_pools(&self, results: &[Result<Reserved, LinkError>], targets: &[Target]) {
        let mut st = self.lock();
        for (r, (p, _, _)) in results.iter().zip(targets) {
            if let (Ok(reply), Some(n)) = (r, st.nodes.get_mut(&p.node)) {
                n.pool = reply.pool.unwrap_or(n.pool);
            }
        }
    }

    /// Releases every target of a failed allocation, the failed ones
    /// too: a reservation that timed out may still have happened. The
    /// table's side is undone by the allocation's [`Unwind`].
    async fn release_all(&self, id: u64, targets: &[Target]) {
        let releases = targets
            .iter()
            .map(|(_, addr, _)| self.link.release(addr, id));
        for r in join_all(releases).await {
            if let Err(e) = r {
                tracing::warn!(alloc_id = id, error = %e, "release during rollback failed; the node's next heartbeat reconciles it");
            }
        }
    }
}

/// The table's side of an allocation that is being reserved: undone on
/// drop unless committed, so an allocation that fails, or whose request
/// goes away mid-reservation (a client gone, a deadline passed: the
/// future is dropped at an await), gives back its name, its room on the
/// nodes, its user's charge and its id's "reserving" mark (the agents'
/// next heartbeats then release whatever they reserved).
struct Unwind<'a, L: AgentLink> {
    master: &'a Master<L>,
    id: u64,
    name: &'a str,
    targets: &'a [Target],
    charge: Option<&'a (u32, Charge)>,
    committed: bool,
}

impl<L: AgentLink> Drop for Unwind<'_, L> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut st = self.master.lock();
        st.reserving.remove(&self.id);
        st.unreserve_gpus(self.targets);
        if st.names.get(self.name) == Some(&self.id) {
            st.names.remove(self.name);
        }
        if let Some((uid, c)) = self.charge {
            st.charge(*uid, c, false);
        }
        for (p, _, _) in self.targets {
            if let (Some(n), None) = (st.nodes.get_mut(&p.node), p.gpu) {
                n.reserved = n.reserved.saturating_sub(n.footprint(p.bytes()));
            }
        }
    }
}

/// What the creator on `origin` will use for the share `p`, refused up
/// front when its preference cannot reach the node.
fn creator_fabric(
    st: &State,
    p: &Planned,
    kind: Kind,
    origin: &str,
    preference: Fabric,
) -> Result<Fabric, CoreError> {
    if kind == Kind::LocalGpu {
        // In the creator's own process: no fabric reaches it.
        return Ok(Fabric::Auto);
    }
    let verbs = |node: &str| st.nodes.get(node).is_some_and(|n| n.info.has_verbs());
    let rdma = if verbs(&p.node) && verbs(origin) {
        Rdma::Both
    } else {
        Rdma::Unavailable(
            format!(
                "{} or {} has no usable RDMA port (see `ocmctl nodes`)",
                p.node,
                if origin.is_empty() {
                    "the caller"
                } else {
                    origin
                }
            )
            .into(),
        )
    };
    let memory = match p.gpu {
        // Registered at reservation on a node with verbs.
        None => Memory::Host { rdma: true },
        Some(_) => Memory::Gpu {
            rdma: st
                .nodes
                .get(&p.node)
                .is_some_and(|n| !n.info.gpu_rdma.is_empty()),
        },
    };
    fabric::choose(&p.node, memory, origin, preference, &rdma)
        .map_err(|e| CoreError::InvalidArgument(e.to_string()))
}

/// What a planned allocation counts against its user: the bytes planned
/// on each node (the agents' pieces tile them exactly, so the record's
/// extents give back the same when it is freed).
fn plan_charge(plan: &[Planned], size: u64, persistent: bool) -> Charge {
    let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
    for p in plan {
        *nodes.entry(p.node.clone()).or_default() += p.bytes();
    }
    Charge {
        bytes: size,
        nodes,
        persistent,
    }
}

/// Takes the planned shares out of their nodes' free room (host bytes, or
/// a GPU's while the reservation is in flight); returns them with their
/// agents' addresses.
fn hold(st: &mut State, plan: Vec<Planned>) -> Result<Vec<Target>, CoreError> {
    let mut targets = Vec::with_capacity(plan.len());
    for p in plan {
        let node = st
            .nodes
            .get_mut(&p.node)
            .ok_or_else(|| CoreError::NodeDown(p.node.clone()))?;
        if p.gpu.is_none() {
            node.reserved += node.footprint(p.bytes());
        }
        let (agent, data) = (node.info.agent_addr.clone(), node.info.data_addr.clone());
        if let Some(g) = p.gpu {
            *st.gpu_reserving.entry((p.node.clone(), g)).or_default() += p.bytes();
        }
        targets.push((p, agent, data));
    }
    Ok(targets)
}

/// Checks that an agent's pieces tile the planned ranges exactly.
pub(super) fn check_pieces(p: &Planned, pieces: Vec<Piece>) -> Result<Vec<Piece>, LinkError> {
    let mut next = pieces.iter().peekable();
    for &(offset, len) in &p.ranges {
        let mut at = offset;
        while at < offset + len {
            match next.next() {
                Some(piece) if piece.alloc_offset == at && piece.len > 0 => at += piece.len,
                _ => break,
            }
        }
        if at != offset + len {
            return Err(LinkError::BadReply(format!(
                "agent returned pieces that do not tile [{offset}, {})",
                offset + len
            )));
        }
    }
    if next.peek().is_some() {
        return Err(LinkError::BadReply(
            "agent returned pieces outside the requested ranges".into(),
        ));
    }
    Ok(pieces)
}
