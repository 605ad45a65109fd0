//! The etcd v3 calls a master needs to be elected: a lease granted, kept
//! alive and revoked, and etcd's election service (campaign, leader,
//! resign) on that lease, over etcd's own gRPC wire (the protos in
//! `proto/`, trimmed to these calls and compiled without `protoc`).
//!
//! It owns the channel to the etcd members and turns their answers into
//! plain values and [`EtcdError`]; it never decides anything (when to
//! campaign, what losing a lease means): its caller does. etcd's types
//! never leave this crate.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod mvccpb {
    tonic::include_proto!("mvccpb");
}
#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

use etcdserverpb::lease_client::LeaseClient;
use v3electionpb::election_client::ElectionClient;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint that is not a URL (`http://host:port`).
    #[error("etcd endpoint {endpoint:?} is not a URL such as http://127.0.0.1:2379: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// etcd did not answer, or refused the call.
    #[error("etcd {call}: {status}")]
    Call {
        call: &'static str,
        status: Box<tonic::Status>,
    },
    /// etcd answered a lease grant with an error of its own.
    #[error("etcd refused a lease of {ttl} s: {error}")]
    Grant { ttl: u64, error: String },
    /// The lease is gone (expired or revoked): whatever it held is lost.
    #[error("etcd lease {0:x} has expired or was revoked")]
    LeaseGone(i64),
    /// etcd did not answer in time (the caller's bound).
    #[error("etcd did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// An answer without the field that makes it one.
    #[error("etcd {0} answered without its result")]
    Malformed(&'static str),
}

/// `message` as a request that the etcd member answering it refuses while
/// it has no leader itself (etcd's `hasleader` metadata): a member cut off
/// from the rest must not keep a lease alive or hold a campaign open.
fn with_leader<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    req
}

fn call(call: &'static str) -> impl FnOnce(tonic::Status) -> EtcdError {
    move |status| EtcdError::Call {
        call,
        status: Box::new(status),
    }
}

/// A client of one etcd cluster (any of its members answers).
#[derive(Clone)]
pub struct Etcd {
    lease: LeaseClient<Channel>,
    election: ElectionClient<Channel>,
}

/// A lease etcd granted: what it holds goes when it is not kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub ttl: Duration,
}

/// Leadership of an election, as etcd recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub name: Vec<u8>,
    /// The leader's own key in the election.
    pub key: Vec<u8>,
    /// The revision at which the leader's key was made: each new leader's
    /// is larger than every earlier one's (a term).
    pub term: i64,
    pub lease: i64,
}

/// The current leader of an election, as etcd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// What the leader campaigned with.
    pub value: Vec<u8>,
    /// Its term ([`Leadership::term`]).
    pub term: i64,
}

impl Etcd {
    /// A client of the etcd members at `endpoints` (`http://host:port`),
    /// connected lazily: each call dials a member that answers, and waits
    /// at most `timeout` for one (and for its answer, except a campaign).
    ///
    /// # Errors
    /// [`EtcdError::NoEndpoint`], [`EtcdError::Endpoint`].
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoint);
        }
        let parsed = endpoints
            .iter()
            .map(|e| {
                Endpoint::from_shared(e.clone())
                    .map(|ep| ep.connect_timeout(timeout))
                    .map_err(|err| EtcdError::Endpoint {
                        endpoint: e.clone(),
                        reason: err.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(parsed.into_iter());
        Ok(Self {
            lease: LeaseClient::new(channel.clone()),
            election: ElectionClient::new(channel),
        })
    }

    /// A new lease of `ttl` (whole seconds, at least one).
    ///
    /// # Errors
    /// [`EtcdError::Call`], [`EtcdError::Grant`].
    pub async fn grant(&self, ttl: Duration) -> Result<Lease, EtcdError> {
        let secs = ttl.as_secs().max(1);
        let r = self
            .lease
            .clone()
            .lease_grant(etcdserverpb::LeaseGrantRequest {
                ttl: i64::try_from(secs).unwrap_or(i64::MAX),
                id: 0,
            })
            .await
            .map_err(call("lease grant"))?
            .into_inner();
        if !r.error.is_empty() {
            return Err(EtcdError::Grant {
                ttl: secs,
                error: r.error,
            });
        }
        Ok(Lease {
            id: r.id,
            ttl: Duration::from_secs(u64::try_from(r.ttl).unwrap_or(0)),
        })
    }

    /// Gives `lease` up at once (whatever it holds goes with it).
    ///
    /// # Errors
    /// [`EtcdError::Call`].
    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.lease
            .clone()
            .lease_revoke(etcdserverpb::LeaseRevokeRequest { id: lease })
            .await
            .map_err(call("lease revoke"))?;
        Ok(())
    }

    /// A stream that renews `lease` on each [`KeepAlive::renew`], opened
    /// with a first renewal (etcd answers the call once it has one).
    ///
    /// # Errors
    /// [`EtcdError::Call`], [`EtcdError::LeaseGone`].
    pub async fn keep_alive(&self, lease: i64) -> Result<KeepAlive, EtcdError> {
        let (tx, rx) = mpsc::channel(1);
        let first = etcdserverpb::LeaseKeepAliveRequest { id: lease };
        // A fresh channel of one slot: the send cannot fail or wait.
        let _ = tx.try_send(first);
        let replies = self
            .lease
            .clone()
            .lease_keep_alive(with_leader(ReceiverStream::new(rx)))
            .await
            .map_err(call("lease keep-alive"))?
            .into_inner();
        let mut alive = KeepAlive { lease, tx, replies };
        alive.reply().await?;
        Ok(alive)
    }

    /// Waits until `value` leads election `name` on `lease` (for ever, while
    /// another leads and the lease lives), then says with which term.
    ///
    /// # Errors
    /// [`EtcdError::Call`] (the lease gone among the causes),
    /// [`EtcdError::Malformed`].
    pub async fn campaign(
        &self,
        name: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Leadership, EtcdError> {
        let r = self
            .election
            .clone()
            .campaign(with_leader(v3electionpb::CampaignRequest {
                name: name.as_bytes().to_vec(),
                lease,
                value: value.to_vec(),
            }))
            .await
            .map_err(call("campaign"))?
            .into_inner();
        let l = r.leader.ok_or(EtcdError::Malformed("campaign"))?;
        Ok(Leadership {
            name: l.name,
            key: l.key,
            term: l.rev,
            lease: l.lease,
        })
    }

    /// The current leader of election `name`; `None` when nobody leads.
    ///
    /// # Errors
    /// [`EtcdError::Call`] (other than "no leader").
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, EtcdError> {
        match self
            .election
            .clone()
            .leader(v3electionpb::LeaderRequest {
                name: name.as_bytes().to_vec(),
            })
            .await
        {
            Ok(r) => Ok(r.into_inner().kv.map(|kv| Leader {
                value: kv.value,
                term: kv.create_revision,
            })),
            // etcd answers "election: no leader" as an error.
            Err(s) if s.message().contains("no leader") => Ok(None),
            Err(s) => Err(call("leader")(s)),
        }
    }

    /// Gives `leadership` up: the next campaigner leads.
    ///
    /// # Errors
    /// [`EtcdError::Call`].
    pub async fn resign(&self, leadership: &Leadership) -> Result<(), EtcdError> {
        self.election
            .clone()
            .resign(v3electionpb::ResignRequest {
                leader: Some(v3electionpb::LeaderKey {
                    name: leadership.name.clone(),
                    key: leadership.key.clone(),
                    rev: leadership.term,
                    lease: leadership.lease,
                }),
            })
            .await
            .map_err(call("resign"))?;
        Ok(())
    }
}

/// Renewals of one lease over one keep-alive stream.
pub struct KeepAlive {
    lease: i64,
    tx: mpsc::Sender<etcdserverpb::LeaseKeepAliveRequest>,
    replies: Streaming<etcdserverpb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Renews the lease; how long it now has.
    ///
    /// # Errors
    /// [`EtcdError::LeaseGone`] when etcd no longer has it;
    /// [`EtcdError::Call`] when the stream broke (the lease may still live
    /// until its time is up: renew on a new stream).
    pub async fn renew(&mut self) -> Result<Duration, EtcdError> {
        let ask = etcdserverpb::LeaseKeepAliveRequest { id: self.lease };
        if self.tx.send(ask).await.is_err() {
            return Err(call("lease keep-alive")(tonic::Status::unavailable(
                "the keep-alive stream closed",
            )));
        }
        self.reply().await
    }

    /// The answer to the last renewal sent.
    async fn reply(&mut self) -> Result<Duration, EtcdError> {
        match self.replies.message().await {
            Ok(Some(r)) if r.ttl > 0 => Ok(Duration::from_secs(r.ttl.unsigned_abs())),
            Ok(Some(_)) => Err(EtcdError::LeaseGone(self.lease)),
            Ok(None) => Err(call("lease keep-alive")(tonic::Status::unavailable(
                "etcd ended the keep-alive stream",
            ))),
            Err(s) => Err(call("lease keep-alive")(s)),
        }
    }
}
