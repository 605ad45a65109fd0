//! The reliable-connected queue pair's life: its states, the endpoint
//! each side sends the other through `Agent.ConnectVerbs`, and the path
//! attributes both sides derive from the pair of endpoints. Pure: the
//! verbs layer applies what this computes; tests check it without a device.
//! It never encodes an endpoint for the wire (`oncilla-proto` does).

use crate::RdmaError;

/// The states Oncilla drives a queue pair through (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Reset,
    Init,
    /// Ready to receive: knows its peer.
    Rtr,
    /// Ready to send.
    Rts,
    Error,
}

impl State {
    /// The state after moving to `to`, if that move is allowed: forward
    /// one step at a time, to `Error` from anywhere, and back to `Reset`
    /// from `Error` only.
    ///
    /// # Errors
    /// Any other move: [`RdmaError::Transition`].
    pub fn to(self, to: State) -> Result<State, RdmaError> {
        use State::*;
        match (self, to) {
            (Reset, Init) | (Init, Rtr) | (Rtr, Rts) | (_, Error) | (Error, Reset) => Ok(to),
            _ => Err(RdmaError::Transition { from: self, to }),
        }
    }
}

/// What one side tells the other about its queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub qp_num: u32,
    pub lid: u16,
    /// All zero when the port routes by LID only.
    pub gid: [u8; 16],
    pub psn: u32,
    /// Active MTU in bytes.
    pub mtu: u32,
    pub roce: bool,
}

/// Attributes for the RTR and RTS transitions towards a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub dest_qp_num: u32,
    pub dlid: u16,
    /// Global routing: the peer's GID and the local GID index to send from.
    pub grh: Option<([u8; 16], u8)>,
    /// `enum ibv_mtu` (1 = 256 B .. 5 = 4096 B) of the smaller MTU.
    pub mtu: u32,
    /// Expected first PSN from the peer, and the first PSN we send.
    pub rq_psn: u32,
    pub sq_psn: u32,
}

const PSN_MASK: u32 = 0x00ff_ffff;

/// `enum ibv_mtu` for an MTU in bytes.
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// An MTU in bytes for `enum ibv_mtu`.
pub fn mtu_bytes(e: u32) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128 << e)
}

/// The path from `local` to `remote`; `gid_index` is the local GID table
/// entry to send from (needed on RoCE, and whenever the peer gave a GID).
///
/// # Errors
/// Endpoints that cannot form a pair: different link layers, a RoCE end
/// without a GID, bad QP numbers, PSNs or MTUs.
pub fn path(
    local: &Endpoint,
    gid_index: Option<u32>,
    remote: &Endpoint,
) -> Result<Path, RdmaError> {
    if local.roce != remote.roce {
        return Err(RdmaError::LinkLayers {
            local: layer(local.roce),
            remote: layer(remote.roce),
        });
    }
    if remote.qp_num == 0 || remote.qp_num > PSN_MASK {
        return Err(RdmaError::PeerQpNum(remote.qp_num));
    }
    if remote.psn > PSN_MASK || local.psn > PSN_MASK {
        return Err(RdmaError::Psn);
    }
    let (Some(_), Some(_)) = (mtu_enum(local.mtu), mtu_enum(remote.mtu)) else {
        return Err(RdmaError::Mtu {
            local: local.mtu,
            remote: remote.mtu,
        });
    };
    let mtu = mtu_enum(local.mtu.min(remote.mtu)).unwrap_or(1);
    let has_gid = remote.gid != [0; 16];
    if remote.roce && !has_gid {
        return Err(RdmaError::PeerNoGid);
    }
    if !remote.roce && remote.lid == 0 {
        return Err(RdmaError::PeerNoLid);
    }
    let grh = if has_gid {
        let index = gid_index.ok_or(RdmaError::LocalNoGid)?;
        let index = u8::try_from(index).map_err(|_| RdmaError::GidIndex(index))?;
        Some((remote.gid, index))
    } else {
        None
    };
    Ok(Path {
        dest_qp_num: remote.qp_num,
        dlid: remote.lid,
        grh,
        mtu,
        rq_psn: remote.psn,
        sq_psn: local.psn,
    })
}

fn layer(roce: bool) -> &'static str {
    if roce {
        "Ethernet (RoCE)"
    } else {
        "InfiniBand"
    }
}

/// A random initial PSN (24 bits), so a stale packet of an earlier pair
/// with the same QP number is not taken for a new one.
pub fn random_psn() -> u32 {
    rand::random::<u32>() & PSN_MASK
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
    fn states_move_forward_one_step_or_to_error() {
        let s = State::Reset.to(State::Init).unwrap();
        let s = s.to(State::Rtr).unwrap();
        let s = s.to(State::Rts).unwrap();
        assert!(s.to(State::Init).is_err());
        assert!(State::Reset.to(State::Rts).is_err(), "no skipping RTR");
        assert!(State::Init.to(State::Rts).is_err());
        assert_eq!(State::Rtr.to(State::Error).ok(), Some(State::Error));
        assert_eq!(State::Error.to(State::Reset).ok(), Some(State::Reset));
        assert!(matches!(
            State::Init.to(State::Rts),
            Err(RdmaError::Transition {
                from: State::Init,
                to: State::Rts
            })
        ));
    }

    #[test]
    fn ib_pair_routes_by_lid_and_takes_the_smaller_mtu() {
        let a = ib(0x11, 1);
        let mut b = ib(0x22, 2);
        b.mtu = 2048;
        b.psn = 0xabcdef;
        let p = path(&a, None, &b).unwrap();
        assert_eq!(p.dest_qp_num, 0x22);
        assert_eq!(p.dlid, 2);
        assert_eq!(p.grh, None);
        assert_eq!(p.mtu, 4, "2048 bytes");
        assert_eq!((p.rq_psn, p.sq_psn), (0xabcdef, 0x1234));
        // And the other way round agrees on the MTU.
        assert_eq!(path(&b, None, &a).unwrap().mtu, 4);
    }

    #[test]
    fn roce_needs_gids_and_matching_layers() {
        let mut a = ib(0x11, 0);
        a.roce = true;
        a.gid = [0xfe; 16];
        let mut b = a.clone();
        b.qp_num = 0x22;
        let p = path(&a, Some(3), &b).unwrap();
        assert_eq!(p.grh, Some(([0xfe; 16], 3)));
        assert!(path(&a, None, &b)
            .unwrap_err()
            .to_string()
            .contains("no GID"));
        let mut nogid = b.clone();
        nogid.gid = [0; 16];
        assert!(path(&a, Some(3), &nogid)
            .unwrap_err()
            .to_string()
            .contains("sent no GID"));
        assert!(path(&a, Some(3), &ib(0x22, 2))
            .unwrap_err()
            .to_string()
            .contains("link layers differ"));
        assert!(path(&ib(1, 1), None, &ib(0x22, 0))
            .unwrap_err()
            .to_string()
            .contains("subnet manager"));
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let a = ib(0x11, 1);
        assert!(path(&a, None, &ib(0, 2)).is_err());
        let mut b = ib(0x22, 2);
        b.psn = 1 << 24;
        assert!(path(&a, None, &b).is_err());
        let mut b = ib(0x22, 2);
        b.mtu = 1500;
        assert!(path(&a, None, &b).unwrap_err().to_string().contains("MTU"));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
    }

    #[test]
    fn psns_are_24_bits() {
        assert!(random_psn() <= PSN_MASK);
    }
}
