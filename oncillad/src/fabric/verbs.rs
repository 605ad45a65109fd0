//! `Agent.ConnectVerbs`: the agent's end of a queue pair towards a
//! client's, on one of the node's opened RDMA ports ([`crate::hca`]).
//! After that the agent's CPU does nothing per byte: clients READ and
//! WRITE the registered memory directly.
//!
//! The pair lives as long as the client keeps the `ConnectVerbs` stream
//! open; the agent destroys it when the stream ends (idle teardown, the
//! client died, or its port went away: [`crate::hca::Rdma::removed`]). It
//! never interprets allocation ids or access keys.

use crate::hca::{count, Rdma, VerbsError};

/// What a connected client holds on this agent: dropping it destroys the
/// agent's end of the pair.
pub struct Held {
    /// The port it is on.
    pub port: usize,
    _qp: oncilla_rdma::verbs::Qp,
}

/// The agent's end of a new queue pair, as the client needs it.
#[derive(Debug, Clone)]
pub struct Paired {
    /// The agent's queue pair, in RTS towards the client.
    pub endpoint: oncilla_rdma::qp::Endpoint,
    /// The device and port it lives on.
    pub device: String,
    pub port: u32,
}

/// Makes the agent's end of a queue pair towards `client`, on port
/// `port_index` modulo the opened ports.
///
/// # Errors
/// [`VerbsError::Unavailable`] with the reason when this node has no
/// verbs; [`VerbsError::Pair`] for an endpoint that cannot pair;
/// [`VerbsError::Hca`] when the HCA refuses.
pub fn connect(
    rdma: &Rdma,
    client: &oncilla_rdma::qp::Endpoint,
    port_index: u32,
) -> Result<(Paired, Held), VerbsError> {
    if let Some(why) = rdma.unavailable() {
        return Err(VerbsError::Unavailable(why));
    }
    let made = connect_on(rdma, client, port_index);
    count(match &made {
        Ok(_) => &rdma.counts.pairs,
        Err(_) => &rdma.counts.pair_failures,
    });
    made
}

fn connect_on(
    rdma: &Rdma,
    client: &oncilla_rdma::qp::Endpoint,
    port_index: u32,
) -> Result<(Paired, Held), VerbsError> {
    let live = rdma.live();
    let Some((port, dev)) = live.get(port_index as usize % live.len().max(1)) else {
        return Err(VerbsError::Unavailable(
            "every opened RDMA port went away".into(),
        ));
    };
    let mut qp = oncilla_rdma::verbs::Qp::new(dev, QP_DEPTH).map_err(VerbsError::Hca)?;
    qp.connect(client).map_err(VerbsError::Pair)?;
    let paired = Paired {
        endpoint: qp.endpoint(),
        device: dev.port.device.clone(),
        port: dev.port.port,
    };
    Ok((
        paired,
        Held {
            port: *port,
            _qp: qp,
        },
    ))
}

/// The agent's queue pairs only answer one-sided requests; their own send
/// queue stays empty, so a small depth is enough.
const QP_DEPTH: u32 = 16;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::pool::{HugePages, Pool, PoolSpec};

    #[test]
    fn without_ports_a_pair_is_refused_with_the_reason() {
        let pool = Pool::new(PoolSpec::new(4 * 4096, HugePages::Off)).unwrap();
        let r = Rdma::start_at(Path::new("/nonexistent/infiniband"), &[], &pool);
        let client = oncilla_rdma::qp::Endpoint {
            qp_num: 7,
            lid: 0,
            gid: [0; 16],
            psn: 0,
            mtu: 1024,
            roce: true,
        };
        let err = connect(&r, &client, 0).err().unwrap();
        assert!(matches!(err, VerbsError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("unavailable"), "{err}");
    }
}
