//! Freeing, attaching and detaching, and the end of a session: who may do
//! what to an allocation, and telling its holders to release it. The
//! asking session arrives as an id checked by the edge; this module never
//! parses.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use oncilla_model::alloc::{AllocRef, Allocation, Owner, MAX_BATCH};
use oncilla_model::cluster::FreeBatch;
use oncilla_model::node::NodeState;

use super::state::State;
use super::{AgentLink, Master};
use crate::error::CoreError;

impl<L: AgentLink> Master<L> {
    /// Frees an allocation. `session` is the asking session and `uid` its
    /// process's user; `session` is empty for operators. A persistent allocation that other processes are attached
    /// to is freed only with `force`; they then get "no such allocation"
    /// from every copy.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`] / [`CoreError::NoSuchName`];
    /// [`CoreError::PermissionDenied`] when a session frees another
    /// session's allocation, or a persistent one another user made; [`CoreError::InUse`] without `force`;
    /// [`CoreError::Recovering`].
    pub async fn free(
        &self,
        target: &AllocRef,
        session: &str,
        uid: Option<u32>,
        force: bool,
    ) -> Result<(), CoreError> {
        self.check_serving()?;
        let (id, freed) = {
            let mut st = self.lock();
            let id = st.resolve(target)?;
            may_free(&st, id, session, uid, force)?;
            (id, vec![self.remove_freed(&mut st, id)])
        };
        self.release_freed(freed).await;
        tracing::info!(alloc_id = id, force, "freed");
        Ok(())
    }

    /// Frees a batch together: checked as [`Self::free`] checks one
    /// (without `force`) and removed from the table in one hold of the
    /// lock, all or none, then released with one call per agent.
    ///
    /// # Errors
    /// As [`Self::free`], for the first id refused; nothing is freed then.
    pub async fn free_many(
        &self,
        batch: &FreeBatch,
        session: &str,
        uid: Option<u32>,
    ) -> Result<(), CoreError> {
        self.check_serving()?;
        let freed: Vec<(u64, Vec<(String, String)>)> = {
            let mut st = self.lock();
            for &id in batch.ids() {
                may_free(&st, id, session, uid, false)?;
            }
            batch
                .ids()
                .iter()
                .map(|&id| self.remove_freed(&mut st, id))
                .collect()
        };
        self.release_freed(freed).await;
        tracing::info!(count = batch.ids().len(), "freed a batch");
        Ok(())
    }

    /// Tells the holders of freed allocations to release them, one call
    /// per agent for up to [`MAX_BATCH`] of them (agents at once), and
    /// records their pool usage. A holder that cannot be reached drops
    /// them on its next heartbeat (it reports what it holds; the master
    /// answers with what to release).
    pub(super) async fn release_freed(&self, freed: Vec<(u64, Vec<(String, String)>)>) {
        let mut by_agent: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        for (id, holders) in freed {
            for holder in holders {
                by_agent.entry(holder).or_default().push(id);
            }
        }
        let replies = join_all(by_agent.iter().map(|((_, addr), ids)| async move {
            let mut last = Ok(None);
            for chunk in ids.chunks(MAX_BATCH as usize) {
                last = self.link.release_many(addr, chunk.to_vec()).await;
                if last.is_err() {
                    break;
                }
            }
            last
        }))
        .await;
        let mut st = self.lock();
        for (((node, _), ids), r) in by_agent.iter().zip(replies) {
            match r {
                Ok(pool) => {
                    if let Some(n) = st.nodes.get_mut(node) {
                        n.pool = pool.unwrap_or(n.pool);
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node, allocations = ids.len(), error = %e, "agent did not confirm a release; its next heartbeat reconciles it");
                }
            }
        }
    }

    /// Attaches a process to a persistent allocation (by id or name).
    ///
    /// # Errors
    /// Unknown allocations; [`CoreError::InvalidArgument`] for one that
    /// belongs to a session (it ends with that session);
    /// [`CoreError::Recovering`].
    pub fn attach(&self, target: &AllocRef, who: Owner) -> Result<Allocation, CoreError> {
        self.check_serving()?;
        let mut st = self.lock();
        let id = st.resolve(target)?;
        let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
        if let Some(owner) = &rec.alloc.owner {
            return Err(CoreError::InvalidArgument(format!(
                "allocation {id} belongs to {owner} and ends with it; only persistent allocations can be attached"
            )));
        }
        if let Some(user) = rec.alloc.user {
            if !rec.alloc.shared && who.uid != Some(user) {
                return Err(CoreError::PermissionDenied(format!(
                    "allocation {id} is private to the user that made it (uid {user}); it can be made shared when allocated"
                )));
            }
        }
        st.attach_session(who, id);
        let alloc = self.view(&st, id)?;
        tracing::info!(alloc_id = id, attached = alloc.attached.len(), "attached");
        Ok(alloc)
    }

    /// Allocation `id` as it is now, for a session that owns it or is
    /// attached to it: where its copies went after a node was lost.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`]; [`CoreError::PermissionDenied`]
    /// for any other session (operators use `GetAllocation`);
    /// [`CoreError::Recovering`].
    pub fn lookup(&self, id: u64, who: &Owner) -> Result<Allocation, CoreError> {
        self.check_serving()?;
        let st = self.lock();
        let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
        let owns = rec
            .alloc
            .owner
            .as_ref()
            .is_some_and(|o| o.session_id == who.session_id);
        let attached = st
            .sessions
            .get(&who.session_id)
            .is_some_and(|s| s.attached.contains(&id));
        if !owns && !attached {
            return Err(CoreError::PermissionDenied(format!(
                "allocation {id} is neither this session's nor attached to it"
            )));
        }
        self.view(&st, id)
    }

    /// Detaches a session from an allocation.
    ///
    /// # Errors
    /// [`CoreError::NoSuchAllocation`]; [`CoreError::Recovering`].
    pub fn detach(&self, id: u64, session: &str) -> Result<(), CoreError> {
        self.check_serving()?;
        let mut st = self.lock();
        if !st.allocs.contains_key(&id) {
            return Err(CoreError::NoSuchAllocation(id));
        }
        st.detach_session(session, id);
        Ok(())
    }

    /// Frees every allocation a session owns and detaches it from every
    /// other (its application exited); returns how many were freed.
    pub async fn end_session(&self, session: &str) -> u32 {
        let freed: Vec<(u64, Vec<(String, String)>)> = {
            let mut st = self.lock();
            st.end_session(session)
                .into_iter()
                .map(|id| self.remove_freed(&mut st, id))
                .collect()
        };
        let n = u32::try_from(freed.len()).unwrap_or(u32::MAX);
        self.release_freed(freed).await;
        if n > 0 {
            tracing::info!(
                session,
                freed = n,
                "session ended; its allocations are freed"
            );
        }
        n
    }

    /// Removes allocation `id` from the table; returns it with the holders
    /// worth telling to release it (for [`Self::release_freed`]): those
    /// that are up. The others learn it from the reply to their next
    /// heartbeat.
    fn remove_freed(&self, st: &mut State, id: u64) -> (u64, Vec<(String, String)>) {
        let mut holders = st.remove(id);
        holders.retain(|(node, _)| {
            st.nodes
                .get(node)
                .is_some_and(|n| n.seen.state(&self.liveness).0 == NodeState::Up)
        });
        (id, holders)
    }
}

/// Whether the asking `session` (of user `uid`; empty for operators) may
/// free allocation `id`: a session frees only its own, or a persistent one
/// its user made; one other processes are attached to only with `force`.
///
/// # Errors
/// [`CoreError::NoSuchAllocation`]; [`CoreError::PermissionDenied`];
/// [`CoreError::InUse`].
fn may_free(
    st: &State,
    id: u64,
    session: &str,
    uid: Option<u32>,
    force: bool,
) -> Result<(), CoreError> {
    let rec = st.allocs.get(&id).ok_or(CoreError::NoSuchAllocation(id))?;
    if let Some(owner) = &rec.alloc.owner {
        if !session.is_empty() && owner.session_id != session {
            // Never the owner's session id: it names the session to
            // whoever can present it.
            return Err(CoreError::PermissionDenied(format!(
                "allocation {id} belongs to another session"
            )));
        }
    } else if let Some(user) = rec.alloc.user {
        if !session.is_empty() && uid != Some(user) {
            return Err(CoreError::PermissionDenied(format!(
                "allocation {id} was made by another user (uid {user}); only that user or an operator may free it"
            )));
        }
    }
    let others: Vec<String> = st
        .attached_to(id)
        .into_iter()
        .filter(|a| a.session_id != session)
        .map(ToString::to_string)
        .collect();
    if !others.is_empty() && !force {
        return Err(CoreError::InUse {
            id,
            by: others.join(", "),
        });
    }
    Ok(())
}
