//! The `Master` service as operators and their tools call it: nodes,
//! allocations, persistent allocations and quotas in domain values.

use oncilla_model::alloc::{AllocRef, AllocSpec, Allocation};
use oncilla_model::node::{NodeList, NodeStatus};
use oncilla_model::quota::{Limits, Report, Subject};

use super::{read, CallError};
use crate::client::{self, AuthChannel, MasterClient};
use crate::pb;

/// A master, called in domain values. Cheap to clone (one connection).
#[derive(Clone)]
pub struct Master(MasterClient);

/// One page of the allocation table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationPage {
    pub allocations: Vec<Allocation>,
    /// The id to ask after for the next page; 0: this was the last.
    pub next_after: u64,
}

const PEER: &str = "master";

impl Master {
    /// The master at the other end of `channel`.
    pub fn new(channel: AuthChannel) -> Self {
        Self(client::master(channel))
    }

    /// Every node the master knows, and its recovery window.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn list_nodes(&self) -> Result<NodeList, CallError> {
        let list = self.0.clone().list_nodes(pb::ListNodesRequest {}).await?;
        read(PEER, "node list", list.into_inner())
    }

    /// The allocations with ids above `after`, one bounded page.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn list_allocations(&self, after: u64) -> Result<AllocationPage, CallError> {
        let page = self
            .0
            .clone()
            .list_allocations(pb::ListAllocationsRequest { after })
            .await?
            .into_inner();
        Ok(AllocationPage {
            allocations: page
                .allocations
                .into_iter()
                .map(|a| read(PEER, "allocation", a))
                .collect::<Result<_, _>>()?,
            next_after: page.next_after,
        })
    }

    /// One allocation.
    ///
    /// # Errors
    /// [`CallError`] (an unknown allocation included).
    pub async fn get_allocation(&self, alloc: &AllocRef) -> Result<Allocation, CallError> {
        let req = pb::GetAllocationRequest {
            alloc: Some(alloc.clone().into()),
        };
        let a = self.0.clone().get_allocation(req).await?;
        read(PEER, "allocation", a.into_inner())
    }

    /// A persistent allocation (it outlives the caller).
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn allocate(&self, spec: &AllocSpec) -> Result<Allocation, CallError> {
        let req = pb::AllocateRequest {
            spec: Some(spec.clone().into()),
            origin_node: String::new(),
            requester: None,
        };
        let a = self.0.clone().allocate(req).await?;
        read(PEER, "allocation", a.into_inner())
    }

    /// Frees an allocation (`force`: even while processes are attached).
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn free(&self, alloc: &AllocRef, force: bool) -> Result<(), CallError> {
        let req = pb::FreeRequest {
            requester: None,
            alloc: Some(alloc.clone().into()),
            session_id: String::new(),
            force,
        };
        self.0.clone().free(req).await?;
        Ok(())
    }

    /// Every quota and what each user holds.
    ///
    /// # Errors
    /// [`CallError`].
    pub async fn list_quotas(&self) -> Result<Report, CallError> {
        let q = self.0.clone().list_quotas(pb::ListQuotasRequest {}).await?;
        Ok(q.into_inner().into())
    }

    /// Removes node `name`, which must be down: its allocations lose what
    /// they had there. How many did.
    ///
    /// # Errors
    /// [`CallError`] (a node that is up is refused).
    pub async fn remove_node(&self, name: &str) -> Result<u64, CallError> {
        let req = pb::LeaveRequest {
            name: name.to_string(),
            incarnation: 0,
        };
        Ok(self.0.clone().leave(req).await?.into_inner().lost)
    }

    /// Starts (`drain`) or ends draining node `name`; the node after.
    ///
    /// # Errors
    /// [`CallError`] (an unknown node, among others).
    pub async fn drain(&self, name: &str, drain: bool) -> Result<NodeStatus, CallError> {
        let req = pb::DrainRequest {
            name: name.to_string(),
            drain,
        };
        let node = self.0.clone().drain(req).await?;
        read(PEER, "node", node.into_inner())
    }

    /// Sets `who`'s limits (`None`: drops a user's own); the quotas after.
    ///
    /// # Errors
    /// [`CallError`] (the master keeps no quota file, among others).
    pub async fn set_quota(
        &self,
        who: Subject,
        limits: Option<Limits>,
    ) -> Result<Report, CallError> {
        let req = crate::convert::quota_request(who, limits);
        let q = self.0.clone().set_quota(req).await?;
        Ok(q.into_inner().into())
    }
}
