//! Outgoing gRPC: the master's link to agents ([`GrpcAgentLink`], the
//! master core's `AgentLink`) and an agent's link to the master
//! ([`MasterLink`], the agent core's `MasterPort`, and what the session
//! service forwards). Domain values are converted here, at the edge;
//! channels are made once per peer and reused.

use std::sync::Arc;

use dashmap::DashMap;
use oncilla_model::cluster::{
    Heartbeat, HeartbeatReply, Registered, Registration, Release, Reservation, Reserved, SetCopies,
};
use oncilla_model::node::PoolUsage;
use oncilla_net::auth::Token;
use oncilla_net::credential::Credential;
use oncilla_net::tls::ClientTls;
use oncilla_proto::client::{self, AgentClient, MasterClient};
use oncilla_proto::masters::Masters;
use oncilla_proto::pb;
use tonic::Status;

use super::status::link_error;
use crate::agent::MasterPort;
use crate::error::LinkError;
use crate::master::tenure::Tenure;
use crate::master::AgentLink;

/// Deadline of a release and of an identity probe (shorter than other
/// calls: see `release` and `identify`).
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Deadline of a copy change that fills a new replica (the agent gives up
/// on the fill at 50 s, `grpc::agent`, inside servers' 60 s to answer).
pub const FILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(55);

/// A failed call to the peer `what` at `addr`, as the core sees it.
fn failed(what: &str, addr: &str, s: Status) -> LinkError {
    let message = client::unreachable(what, addr, s.clone())
        .message()
        .to_string();
    link_error(&s, message)
}

/// The master's connections to agents, one channel per agent address.
pub struct GrpcAgentLink {
    token: Token,
    tls: Option<ClientTls>,
    clients: DashMap<String, AgentClient>,
    /// An elected master's tenure: its term goes with every change it
    /// asks of an agent, and none is asked once the tenure lapsed.
    tenure: Option<Arc<Tenure>>,
}

impl GrpcAgentLink {
    /// Links presenting `token`, over TLS trusting `tls` when given.
    pub fn new(token: Token, tls: Option<ClientTls>) -> Self {
        Self {
            token,
            tls,
            clients: DashMap::new(),
            tenure: None,
        }
    }

    /// The links of the master elected for `tenure`.
    #[must_use]
    pub fn elected(mut self, tenure: Arc<Tenure>) -> Self {
        self.tenure = Some(tenure);
        self
    }

    /// `req` marked with this master's term, unless its tenure lapsed.
    fn fenced<T>(&self, addr: &str, req: T) -> Result<tonic::Request<T>, LinkError> {
        let mut req = tonic::Request::new(req);
        if let Some(t) = &self.tenure {
            if !t.holds() {
                return Err(LinkError::Refused(format!(
                    "not asking agent {addr}: this master's leadership (term {}) has lapsed",
                    t.term()
                )));
            }
            client::set_term(&mut req, t.term());
        }
        Ok(req)
    }

    fn client(&self, addr: &str) -> Result<AgentClient, LinkError> {
        if let Some(c) = self.clients.get(addr) {
            return Ok(c.clone());
        }
        let channel = client::lazy(addr, &self.token, self.tls.as_ref())
            .map_err(|e| LinkError::Unreachable(e.to_string()))?;
        let c = client::agent(channel);
        self.clients.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl AgentLink for GrpcAgentLink {
    async fn reserve(
        &self,
        addr: &str,
        reqs: Vec<Reservation>,
    ) -> Result<Vec<Reserved>, LinkError> {
        let req = self.fenced(addr, pb::ReserveBatch::from(reqs))?;
        let mut c = self.client(addr)?;
        c.reserve(req)
            .await
            .map(|r| r.into_inner().into())
            .map_err(|s| failed("agent", addr, s))
    }

    async fn release(&self, addr: &str, r: Release) -> Result<Option<PoolUsage>, LinkError> {
        let mut req = self.fenced(addr, pb::ReleaseRequest::from(r))?;
        let mut c = self.client(addr)?;
        // Best effort: a holder that misses it releases on its next
        // heartbeat, so a free never waits long for a sick node.
        req.set_timeout(RELEASE_TIMEOUT);
        c.release(req)
            .await
            .map(|r| r.into_inner().pool.map(Into::into))
            .map_err(|s| failed("agent", addr, s))
    }

    async fn release_many(
        &self,
        addr: &str,
        ids: Vec<u64>,
    ) -> Result<Option<PoolUsage>, LinkError> {
        let mut req = self.fenced(addr, pb::ReleaseManyRequest { alloc_ids: ids })?;
        let mut c = self.client(addr)?;
        // Best effort, as one release.
        req.set_timeout(RELEASE_TIMEOUT);
        c.release_many(req)
            .await
            .map(|r| r.into_inner().pool.map(Into::into))
            .map_err(|s| failed("agent", addr, s))
    }

    async fn set_copies(&self, addr: &str, req: SetCopies) -> Result<(), LinkError> {
        // A fill moves a whole share before the answer.
        let timeout = if req.fill.is_empty() {
            RELEASE_TIMEOUT
        } else {
            FILL_TIMEOUT
        };
        let mut req = self.fenced(addr, pb::SetCopiesRequest::from(req))?;
        let mut c = self.client(addr)?;
        req.set_timeout(timeout);
        c.set_copies(req)
            .await
            .map(|_| ())
            .map_err(|s| failed("agent", addr, s))
    }

    async fn identify(&self, addr: &str) -> Result<(String, u64), LinkError> {
        let mut c = self.client(addr)?;
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(RELEASE_TIMEOUT);
        let status = c
            .status(req)
            .await
            .map_err(|s| failed("agent", addr, s))?
            .into_inner();
        let name = status.node.map(|n| n.name).unwrap_or_default();
        Ok((name, status.incarnation))
    }
}

/// An agent's connection to the master: the leader among the masters it
/// was given (see [`Masters`]).
#[derive(Clone)]
pub struct MasterLink {
    masters: Arc<Masters<MasterClient>>,
    /// Dialled without TLS (a failure may then mean the master wants it).
    plain: bool,
}

impl MasterLink {
    /// A lazily connected link to the masters at `addrs`, presenting this
    /// node's credential (over TLS trusting `tls` when given).
    ///
    /// # Errors
    /// A message for an address that cannot be dialled.
    pub fn new(
        addrs: &[String],
        credential: &Credential,
        tls: Option<&ClientTls>,
    ) -> Result<Self, client::AddrError> {
        let (credential, trust) = (credential.clone(), tls.cloned());
        let masters = Masters::new(addrs, move |addr| {
            Ok(client::master(client::lazy_as(
                addr,
                &credential,
                trust.as_ref(),
            )?))
        })?;
        Ok(Self {
            masters: Arc::new(masters),
            plain: tls.is_none(),
        })
    }

    /// A failed membership call, as the agent core sees it.
    fn failed(&self, addr: &str, s: Status) -> LinkError {
        let message = self.wrap(addr, s.clone()).message().to_string();
        link_error(&s, message)
    }

    fn wrap(&self, addr: &str, s: Status) -> Status {
        if self.plain {
            client::unreachable_plain("master", addr, s)
        } else {
            client::unreachable("master", addr, s)
        }
    }

    /// `call` at the leading master: its answer and the master that gave
    /// it, or its status named for the master that gave it.
    async fn answered<T, F, Fut>(&self, call: F) -> Result<(String, T), (String, Status)>
    where
        F: FnMut(MasterClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.masters
            .at_leader(|s| Some(s), call)
            .await
            .map(|(addr, r)| (addr, r.into_inner()))
    }

    /// `call` at the leading master; its status, named for the master that
    /// gave it, on failure.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, (String, Status)>
    where
        F: FnMut(MasterClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.answered(call).await.map(|(_, v)| v)
    }

    // What the session service forwards: the master's status goes back to
    // the application as it is (code, message and reason).

    pub async fn allocate(&self, req: pb::AllocateRequest) -> Result<pb::Allocation, Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.allocate(req).await }
        })
        .await
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    pub async fn allocate_many(
        &self,
        req: pb::AllocateManyRequest,
    ) -> Result<pb::AllocationBatch, Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.allocate_many(req).await }
        })
        .await
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    pub async fn free(&self, req: pb::FreeRequest) -> Result<(), Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.free(req).await }
        })
        .await
        .map(|_| ())
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    pub async fn free_many(&self, req: pb::FreeManyRequest) -> Result<(), Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.free_many(req).await }
        })
        .await
        .map(|_| ())
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    pub async fn attach(&self, req: pb::MasterAttachRequest) -> Result<pb::Allocation, Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.attach(req).await }
        })
        .await
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    pub async fn lookup(&self, req: pb::MasterLookupRequest) -> Result<pb::Allocation, Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.lookup(req).await }
        })
        .await
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }

    /// Tells the master this node is leaving (its agent stops): how many
    /// allocations lost bytes with it.
    ///
    /// # Errors
    /// The master cannot be reached or refuses.
    pub async fn leave(&self, name: &str, incarnation: u64) -> Result<u64, LinkError> {
        let req = pb::LeaveRequest {
            name: name.to_string(),
            incarnation,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.leave(req).await }
        })
        .await
        .map(|r| r.lost)
        .map_err(|(addr, s)| self.failed(&addr, s))
    }

    pub async fn detach(&self, req: pb::DetachRequest) -> Result<(), Status> {
        self.call(|mut c| {
            let req = req.clone();
            async move { c.detach(req).await }
        })
        .await
        .map(|_| ())
        .map_err(|(addr, s)| self.wrap(&addr, s))
    }
}

impl MasterPort for MasterLink {
    /// Registers in as many calls as the held allocations need (see
    /// [`pages`]): the master takes each part as it comes.
    async fn register(&self, req: Registration) -> Result<Registered, LinkError> {
        let mut whole = pb::RegisterRequest::from(req);
        let held = std::mem::take(&mut whole.held);
        let mut release = Vec::new();
        let mut first: Option<(String, MasterClient, pb::RegisterReply)> = None;
        let mut last = None;
        let parts = pages(held);
        let last_part = parts.len().saturating_sub(1);
        for (i, part) in parts.into_iter().enumerate() {
            let call = pb::RegisterRequest {
                held: part,
                more: i < last_part,
                ..whole.clone()
            };
            let reply = match &first {
                // The first page finds the leader...
                None => {
                    let (addr, reply) = self
                        .answered(|mut c| {
                            let call = call.clone();
                            async move { c.register(call).await }
                        })
                        .await
                        .map_err(|(addr, s)| self.failed(&addr, s))?;
                    let client = self.masters.client(&addr).ok_or_else(|| {
                        LinkError::Refused(format!(
                            "master {addr} is no longer known; registering again"
                        ))
                    })?;
                    first = Some((addr, client, reply.clone()));
                    reply
                }
                // ...and every later one goes to that same master: a
                // registration split between two masters would leave each
                // a part (and the other part released as unknown).
                Some((addr, client, head)) => {
                    let reply = client
                        .clone()
                        .register(call)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|s| self.failed(addr, s))?;
                    if (reply.master_incarnation, reply.term)
                        != (head.master_incarnation, head.term)
                    {
                        return Err(LinkError::Refused(format!(
                            "the registration's pages were answered by two masters (at {addr}); registering again"
                        )));
                    }
                    reply
                }
            };
            release.extend_from_slice(&reply.release);
            last = Some(reply);
        }
        let mut reply: Registered = last.unwrap_or_default().into();
        reply.release = release;
        Ok(reply)
    }

    async fn heartbeat(&self, req: Heartbeat) -> Result<HeartbeatReply, LinkError> {
        let req = pb::HeartbeatRequest::from(req);
        self.call(|mut c| {
            let mut req = tonic::Request::new(req.clone());
            // A master that does not answer a heartbeat soon is passed
            // over (a frozen leader must not hold the node for a whole
            // call's timeout).
            req.set_timeout(crate::master::HEARTBEAT_DEADLINE);
            async move { c.heartbeat(req).await }
        })
        .await
        .map(Into::into)
        .map_err(|(addr, s)| self.failed(&addr, s))
    }
}

/// Allocation records cut into pages of at most
/// [`client::PAGE_ALLOCATIONS`] records and [`client::PAGE_EXTENTS`]
/// extents (a record with more extents than that is a page alone), so no
/// message outgrows [`client::MAX_MESSAGE`]. Always at least one page.
fn pages(held: Vec<pb::Allocation>) -> Vec<Vec<pb::Allocation>> {
    let mut pages = Vec::new();
    let mut page = Vec::new();
    let mut extents = 0;
    for a in held {
        let n = a.extents.len();
        if !page.is_empty()
            && (page.len() >= client::PAGE_ALLOCATIONS || extents + n > client::PAGE_EXTENTS)
        {
            pages.push(std::mem::take(&mut page));
            extents = 0;
        }
        extents += n;
        page.push(a);
    }
    pages.push(page);
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, extents: usize) -> pb::Allocation {
        pb::Allocation {
            id,
            extents: vec![pb::Extent::default(); extents],
            ..Default::default()
        }
    }

    #[test]
    fn registrations_are_cut_into_bounded_pages_in_order() {
        assert_eq!(
            pages(Vec::new()),
            vec![Vec::new()],
            "one call even when empty"
        );
        let big = client::PAGE_EXTENTS;
        let held = vec![
            record(1, 10),
            record(2, big - 10),
            record(3, 1),
            record(4, big + 5),
        ];
        let cut = pages(held);
        let ids: Vec<Vec<u64>> = cut
            .iter()
            .map(|p| p.iter().map(|a| a.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![1, 2], vec![3], vec![4]]);
        let many: Vec<_> = (1..=client::PAGE_ALLOCATIONS as u64 + 1)
            .map(|i| record(i, 1))
            .collect();
        let cut = pages(many);
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[1].len(), 1);
    }
}
