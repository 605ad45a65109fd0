//! A blocking client of one cluster's `Master` service, for programs that
//! drive a cluster from plain threads (`ocmctl`, the benchmarks, the
//! launcher's readiness waits), and the command-line flags that say how to
//! reach it ([`Conn`]). It owns the connection and its runtime; it never
//! interprets what the master answers.

use std::path::PathBuf;

use oncilla_model::alloc::{AllocRef, AllocSpec, Allocation};
use oncilla_model::node::{NodeList, NodeStatus};
use oncilla_net::auth::{Token, TokenError};
use oncilla_net::tls::{ClientTls, TlsError};
use oncilla_proto::calls::{self, CallError};
use oncilla_proto::client::{self, AddrError};
use oncilla_proto::masters::Masters;

/// Why a call to the master failed.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// The address cannot be dialed.
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// The call failed (unreachable master included); shown as its message.
    #[error("{}", .0.message())]
    Rpc(tonic::Status),
    /// The master answered a record this client cannot read.
    #[error(transparent)]
    Malformed(#[from] calls::Malformed),
    /// A page of allocations pointed back instead of forward.
    #[error("the master paged allocations out of order: after {after} it named {next} next")]
    Paging { after: u64, next: u64 },
    /// The cluster CA given cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The token given cannot be used.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The client's runtime could not start.
    #[error("cannot start runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl MasterError {
    /// Whether it may pass by itself (the master unreachable, restarting
    /// or electing), so asking again later can succeed; a wrong token, a
    /// wrong address or a refusal cannot.
    pub fn may_pass(&self) -> bool {
        matches!(self, MasterError::Rpc(s) if s.code() == tonic::Code::Unavailable)
    }
}

/// How to reach the master (flags of `ocmctl` and `ocmctl bench`).
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Conn {
    /// Master gRPC address; with standby masters, list them all
    /// (comma-separated): the one that leads is followed.
    #[arg(
        long,
        env = "ONCILLA_MASTER",
        default_value = "127.0.0.1:7070",
        value_name = "HOST:PORT"
    )]
    pub master: String,
    /// Cluster token.
    #[arg(long, env = "ONCILLA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the cluster token.
    #[arg(long, env = "ONCILLA_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// The cluster CA certificate, for a cluster whose listeners speak TLS.
    #[arg(long, env = "ONCILLA_TLS_CA", value_name = "PATH")]
    tls_ca: Option<PathBuf>,
}

impl Conn {
    /// The token from `--token`, `--token-file` or their variables.
    ///
    /// # Errors
    /// None given, or one that cannot be read or is malformed.
    pub fn token(&self) -> Result<Token, TokenError> {
        Token::resolve(self.token.as_deref(), self.token_file.as_deref())
    }

    /// What `--tls-ca` says to trust; `None`: the cluster speaks plain TCP.
    ///
    /// # Errors
    /// The CA file cannot be read or holds no certificate.
    pub fn tls(&self) -> Result<Option<ClientTls>, TlsError> {
        self.tls_ca.as_deref().map(ClientTls::load).transpose()
    }

    /// A lazy connection to the master these flags name.
    ///
    /// # Errors
    /// A token or CA that cannot be used; as [`Master::connect`].
    pub fn connect(&self) -> Result<Master, MasterError> {
        Master::connect(&self.master, &self.token()?, self.tls()?.as_ref())
    }
}

/// A connection to a cluster's masters (the leader among them, followed
/// as it changes) with its own single-threaded runtime.
pub struct Master {
    tls: Option<ClientTls>,
    masters: Masters<calls::Master>,
    rt: tokio::runtime::Runtime,
}

impl Master {
    /// A lazy connection to the master at `addrs` (`HOST:PORT`, or several
    /// comma-separated: the leader among them is followed), over TLS
    /// trusting `tls` when given: nothing is dialed until the first call.
    ///
    /// # Errors
    /// A bad address or a runtime that cannot start.
    pub fn connect(
        addrs: &str,
        token: &Token,
        tls: Option<&ClientTls>,
    ) -> Result<Self, MasterError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MasterError::Runtime)?;
        let list: Vec<String> = addrs.split(',').map(|a| a.trim().to_string()).collect();
        let (token, trust) = (token.clone(), tls.cloned());
        let masters = {
            let _guard = rt.enter();
            Masters::new(&list, move |addr| {
                Ok(calls::Master::new(client::lazy(
                    addr,
                    &token,
                    trust.as_ref(),
                )?))
            })?
        };
        Ok(Self {
            tls: tls.cloned(),
            masters,
            rt,
        })
    }

    /// The cluster CA this connection trusts (`None`: plain TCP), for
    /// dialling the cluster's agents too.
    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    /// Runs `f` on the leading master; while the master is in its
    /// recovery window, or while none leads, waits (bounded, one line on
    /// stderr saying why) instead of failing.
    fn call<T, Fut>(&self, f: impl Fn(calls::Master) -> Fut) -> Result<T, MasterError>
    where
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let last = std::cell::RefCell::new(self.masters.current().0);
        let attempt = || async {
            self.masters
                .at_leader(CallError::status, &f)
                .await
                .map(|(_, v)| v)
                .map_err(|(addr, e)| {
                    *last.borrow_mut() = addr;
                    e
                })
        };
        let waiting = |left: std::time::Duration, why: client::Waiting| {
            let at = last.borrow();
            match why {
                client::Waiting::Recovery => eprintln!(
                    "the master at {at} has just started and waits for agents to re-register: waiting {} ms",
                    left.as_millis()
                ),
                client::Waiting::Election => eprintln!(
                    "the master at {at} is a standby and no master leads yet (an election is under way): waiting"
                ),
            }
        };
        let out = self.rt.block_on(client::through_recovery(attempt, waiting));
        out.map_err(|e| match e {
            CallError::Rpc(s) => {
                let at = last.borrow();
                MasterError::Rpc(match self.tls {
                    Some(_) => client::unreachable("master", &at, s),
                    None => client::unreachable_plain("master", &at, s),
                })
            }
            CallError::Malformed(m) => MasterError::Malformed(m),
        })
    }

    /// Every node the master knows.
    ///
    /// # Errors
    /// The call fails.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, MasterError> {
        self.node_list().map(|r| r.nodes)
    }

    /// Nodes, and how long the master still waits for agents to re-register.
    ///
    /// # Errors
    /// The call fails.
    pub fn node_list(&self) -> Result<NodeList, MasterError> {
        self.call(|m| async move { m.list_nodes().await })
    }

    /// Every allocation in the table, page by page (each page a message of
    /// bounded size, however large the table).
    ///
    /// # Errors
    /// A call fails, or the master answers pages out of order.
    pub fn allocations(&self) -> Result<Vec<Allocation>, MasterError> {
        let mut all: Vec<Allocation> = Vec::new();
        self.pages(|page| all.extend(page))?;
        Ok(all)
    }

    /// How many allocations the table holds, counted page by page without
    /// keeping them.
    ///
    /// # Errors
    /// As [`Master::allocations`].
    pub fn allocation_count(&self) -> Result<usize, MasterError> {
        let mut n = 0;
        self.pages(|page| n += page.len())?;
        Ok(n)
    }

    /// Hands every page of the table to `each`, in id order.
    fn pages(&self, mut each: impl FnMut(Vec<Allocation>)) -> Result<(), MasterError> {
        let mut after = 0;
        loop {
            let page = self.call(|m| async move { m.list_allocations(after).await })?;
            each(page.allocations);
            match page.next_after {
                0 => return Ok(()),
                // Ids only grow, so this ends after at most one call per id.
                next if next > after => after = next,
                next => return Err(MasterError::Paging { after, next }),
            }
        }
    }

    /// One allocation.
    ///
    /// # Errors
    /// The call fails (an unknown allocation included).
    pub fn allocation(&self, alloc: &AllocRef) -> Result<Allocation, MasterError> {
        self.call(|m| async move { m.get_allocation(alloc).await })
    }

    /// A persistent allocation (it outlives this process).
    ///
    /// # Errors
    /// The call fails.
    pub fn allocate(&self, spec: AllocSpec) -> Result<Allocation, MasterError> {
        self.call(|m| {
            let spec = spec.clone();
            async move { m.allocate(&spec).await }
        })
    }

    /// Frees an allocation (`force`: even while processes are attached).
    ///
    /// # Errors
    /// The call fails.
    pub fn free(&self, alloc: &AllocRef, force: bool) -> Result<(), MasterError> {
        self.call(|m| async move { m.free(alloc, force).await })
    }

    /// Every quota and what each user holds.
    ///
    /// # Errors
    /// The call fails.
    pub fn quotas(&self) -> Result<oncilla_model::quota::Report, MasterError> {
        self.call(|m| async move { m.list_quotas().await })
    }

    /// Removes node `name` from the cluster (it must be down): how many
    /// allocations lost bytes with it.
    ///
    /// # Errors
    /// The call fails (a node that is up, an unknown node).
    pub fn remove_node(&self, name: &str) -> Result<u64, MasterError> {
        self.call(|m| async move { m.remove_node(name).await })
    }

    /// Starts (`drain`) or ends draining node `name`; the node after.
    ///
    /// # Errors
    /// The call fails (an unknown node, among others).
    pub fn drain(
        &self,
        name: &str,
        drain: bool,
    ) -> Result<oncilla_model::node::NodeStatus, MasterError> {
        self.call(|m| async move { m.drain(name, drain).await })
    }

    /// Sets `who`'s limits (`None`: drops a user's own); the quotas after.
    ///
    /// # Errors
    /// The call fails (the master keeps no quota file, among others).
    pub fn set_quota(
        &self,
        who: oncilla_model::quota::Subject,
        limits: Option<oncilla_model::quota::Limits>,
    ) -> Result<oncilla_model::quota::Report, MasterError> {
        self.call(|m| async move { m.set_quota(who, limits).await })
    }
}
