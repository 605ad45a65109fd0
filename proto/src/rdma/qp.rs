//! The reliable-connected queue pair's life: its states, the endpoint
//! each side sends the other through `Agent.ConnectVerbs`, and the path
//! attributes both sides derive from the pair of endpoints. Pure: the
//! verbs layer applies what this computes; tests check it without a device.

use crate::pb;

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
    /// Any other move.
    pub fn to(self, to: State) -> Result<State, String> {
        use State::*;
        match (self, to) {
            (Reset, Init) | (Init, Rtr) | (Rtr, Rts) | (_, Error) | (Error, Reset) => Ok(to),
            _ => Err(format!("queue pair cannot go from {self:?} to {to:?}")),
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
pub fn path(local: &Endpoint, gid_index: Option<u32>, remote: &Endpoint) -> Result<Path, String> {
    if local.roce != remote.roce {
        return Err(format!(
            "link layers differ: this end is {}, the peer {}",
            layer(local.roce),
            layer(remote.roce)
        ));
    }
    if remote.qp_num == 0 || remote.qp_num > PSN_MASK {
        return Err(format!(
            "peer queue pair number {} is not valid",
            remote.qp_num
        ));
    }
    if remote.psn > PSN_MASK || local.psn > PSN_MASK {
        return Err("packet sequence numbers are 24 bits".into());
    }
    let (Some(_), Some(_)) = (mtu_enum(local.mtu), mtu_enum(remote.mtu)) else {
        return Err(format!(
            "MTUs must be 256..4096 bytes, powers of two: this end {}, the peer {}",
            local.mtu, remote.mtu
        ));
    };
    let mtu = mtu_enum(local.mtu.min(remote.mtu)).unwrap_or(1);
    let has_gid = remote.gid != [0; 16];
    if remote.roce && !has_gid {
        return Err("the peer is on RoCE but sent no GID".into());
    }
    if !remote.roce && remote.lid == 0 {
        return Err(
            "the peer is on InfiniBand but has no LID (is a subnet manager running?)".into(),
        );
    }
    let grh = if has_gid {
        let index = gid_index.ok_or("the peer needs global routing but this port has no GID")?;
        let index = u8::try_from(index).map_err(|_| format!("GID index {index} is above 255"))?;
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

impl Endpoint {
    pub fn to_wire(&self) -> pb::QpEndpoint {
        pb::QpEndpoint {
            qp_num: self.qp_num,
            lid: u32::from(self.lid),
            gid: self.gid.to_vec(),
            psn: self.psn,
            mtu: self.mtu,
            link_layer: if self.roce { "Ethernet" } else { "InfiniBand" }.into(),
        }
    }

    /// # Errors
    /// A GID that is not 16 bytes (or empty), a LID above 16 bits.
    pub fn from_wire(w: &pb::QpEndpoint) -> Result<Self, String> {
        let gid: [u8; 16] = match w.gid.len() {
            0 => [0; 16],
            16 => w.gid.as_slice().try_into().map_err(|_| "bad GID")?,
            n => return Err(format!("GID of {n} bytes; it must be 16")),
        };
        Ok(Self {
            qp_num: w.qp_num,
            lid: u16::try_from(w.lid).map_err(|_| format!("LID {} is above 16 bits", w.lid))?,
            gid,
            psn: w.psn,
            mtu: w.mtu,
            roce: w.link_layer == "Ethernet",
        })
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
        assert_eq!(State::Rtr.to(State::Error), Ok(State::Error));
        assert_eq!(State::Error.to(State::Reset), Ok(State::Reset));
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
        assert!(path(&a, None, &b).unwrap_err().contains("no GID"));
        let mut nogid = b.clone();
        nogid.gid = [0; 16];
        assert!(path(&a, Some(3), &nogid)
            .unwrap_err()
            .contains("sent no GID"));
        assert!(path(&a, Some(3), &ib(0x22, 2))
            .unwrap_err()
            .contains("link layers differ"));
        assert!(path(&ib(1, 1), None, &ib(0x22, 0))
            .unwrap_err()
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
        assert!(path(&a, None, &b).unwrap_err().contains("MTU"));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
    }

    #[test]
    fn endpoints_survive_the_wire() {
        let mut a = ib(0x11, 7);
        a.gid = [9; 16];
        assert_eq!(Endpoint::from_wire(&a.to_wire()), Ok(a.clone()));
        let mut w = a.to_wire();
        w.gid = vec![1; 3];
        assert!(Endpoint::from_wire(&w).is_err());
        w.gid.clear();
        w.lid = 1 << 20;
        assert!(Endpoint::from_wire(&w).is_err());
        assert!(random_psn() <= PSN_MASK);
    }
}
