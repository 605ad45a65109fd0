//! Wire forms of the RDMA layer's types (`oncilla-rdma`): a queue pair's
//! endpoint (`Agent.ConnectVerbs`).
//! The RDMA crate knows nothing of protobuf; this is the one place its
//! types meet the schema. Pure conversions, no device needed.

use oncilla_rdma::qp::Endpoint;

use crate::pb;

/// A queue-pair endpoint from the wire that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("GID of {0} bytes; it must be 16")]
    GidLength(usize),
    #[error("LID {0} is above 16 bits")]
    Lid(u32),
}

impl From<&Endpoint> for pb::QpEndpoint {
    fn from(e: &Endpoint) -> Self {
        pb::QpEndpoint {
            qp_num: e.qp_num,
            lid: u32::from(e.lid),
            gid: e.gid.to_vec(),
            psn: e.psn,
            mtu: e.mtu,
            link_layer: if e.roce { "Ethernet" } else { "InfiniBand" }.into(),
        }
    }
}

impl TryFrom<&pb::QpEndpoint> for Endpoint {
    type Error = EndpointError;

    /// # Errors
    /// A GID that is not 16 bytes (or empty), a LID above 16 bits.
    fn try_from(w: &pb::QpEndpoint) -> Result<Self, EndpointError> {
        let gid: [u8; 16] = match w.gid.len() {
            0 => [0; 16],
            n => w
                .gid
                .as_slice()
                .try_into()
                .map_err(|_| EndpointError::GidLength(n))?,
        };
        Ok(Endpoint {
            qp_num: w.qp_num,
            lid: u16::try_from(w.lid).map_err(|_| EndpointError::Lid(w.lid))?,
            gid,
            psn: w.psn,
            mtu: w.mtu,
            roce: w.link_layer == "Ethernet",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ib(qp: u32, lid: u16) -> Endpoint {
        Endpoint {
            qp_num: qp,
            lid,
            gid: [0; 16],
            psn: 0x1234,
            mtu: 4096,
            roce: false,
        }
    }

    #[test]
    fn endpoints_survive_the_wire() {
        let mut a = ib(0x11, 7);
        a.gid = [9; 16];
        assert_eq!(Endpoint::try_from(&pb::QpEndpoint::from(&a)), Ok(a.clone()));
        let mut w = pb::QpEndpoint::from(&a);
        w.gid = vec![1; 3];
        assert!(Endpoint::try_from(&w).is_err());
        w.gid.clear();
        w.lid = 1 << 20;
        assert!(Endpoint::try_from(&w).is_err());
    }
}
