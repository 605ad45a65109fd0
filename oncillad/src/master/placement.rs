//! Placement: which nodes hold which bytes of a new allocation.
//!
//! A pure function of the request and the nodes' free space, so every rule
//! is unit-tested without a cluster. It never reserves anything itself; the
//! master does that with the plan this returns.

use oncilla_proto::pb::MemKind;
use oncilla_proto::size::HumanBytes;

use crate::error::CoreError;
use crate::pool::round_up;

/// A node as placement sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub free: u64,
    pub up: bool,
    /// The node's pool page size: each extent there takes whole pages.
    pub page: u64,
}

impl Candidate {
    /// Whether `len` bytes fit in one extent here.
    fn holds(&self, len: u64) -> bool {
        round_up(len, self.page) <= self.free
    }

    /// The most whole pages' worth this node can take.
    fn room(&self) -> u64 {
        self.free / self.page.max(1) * self.page.max(1)
    }
}

/// One planned extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub node: String,
    pub alloc_offset: u64,
    pub len: u64,
}

/// What is being asked for.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub size: u64,
    pub kind: MemKind,
    /// Named nodes to split over equally; empty for "anywhere".
    pub nodes: &'a [String],
    /// The requesting node; empty when the request comes from an operator.
    pub origin: &'a str,
}

/// Plans an allocation.
///
/// - `LOCAL_HOST`: one extent on the origin node.
/// - `REMOTE_HOST` on named nodes: an equal split, one extent per node.
/// - `REMOTE_HOST` anywhere: the up node (other than the origin, unless it is
///   the only one) with the most free space; if none can hold it alone, the
///   allocation is spread over the emptiest nodes.
///
/// # Errors
/// Invalid requests, unknown or down nodes, and capacity exhaustion (with
/// every node's free space in the message).
pub fn plan(req: &Request<'_>, nodes: &[Candidate]) -> Result<Vec<Planned>, CoreError> {
    if req.size == 0 {
        return Err(CoreError::InvalidArgument(
            "size must be at least 1 byte".into(),
        ));
    }
    match req.kind {
        MemKind::LocalHost => {
            if !req.nodes.is_empty() {
                return Err(CoreError::InvalidArgument(
                    "a local allocation cannot name nodes; use the remote kind".into(),
                ));
            }
            if req.origin.is_empty() {
                return Err(CoreError::InvalidArgument(
                    "a local allocation needs a local agent; ask through a session".into(),
                ));
            }
            let node = lookup(nodes, req.origin)?;
            fits(req.size, &[node], nodes)?;
            Ok(vec![Planned {
                node: node.name.clone(),
                alloc_offset: 0,
                len: req.size,
            }])
        }
        MemKind::RemoteHost if !req.nodes.is_empty() => split_over(req, nodes),
        MemKind::RemoteHost => anywhere(req, nodes),
        MemKind::Unspecified => Err(CoreError::InvalidArgument(
            "memory kind not given (local or remote host)".into(),
        )),
    }
}

fn split_over(req: &Request<'_>, nodes: &[Candidate]) -> Result<Vec<Planned>, CoreError> {
    let mut chosen = Vec::with_capacity(req.nodes.len());
    for name in req.nodes {
        if chosen.iter().any(|c: &&Candidate| &c.name == name) {
            return Err(CoreError::InvalidArgument(format!(
                "node {name:?} named twice"
            )));
        }
        chosen.push(lookup(nodes, name)?);
    }
    let count = chosen.len() as u64;
    let chunk = req.size.div_ceil(count);
    let mut plan = Vec::with_capacity(chosen.len());
    let mut offset = 0;
    for node in &chosen {
        let len = chunk.min(req.size - offset);
        if len == 0 {
            break;
        }
        if !node.holds(len) {
            return Err(exhausted(req.size, nodes));
        }
        plan.push(Planned {
            node: node.name.clone(),
            alloc_offset: offset,
            len,
        });
        offset += len;
    }
    Ok(plan)
}

fn anywhere(req: &Request<'_>, nodes: &[Candidate]) -> Result<Vec<Planned>, CoreError> {
    let others = nodes
        .iter()
        .filter(|n| n.up && n.name != req.origin)
        .count();
    let mut pool: Vec<&Candidate> = nodes
        .iter()
        .filter(|n| n.up && (others == 0 || n.name != req.origin))
        .collect();
    if pool.is_empty() {
        return Err(CoreError::CapacityExhausted {
            requested: req.size,
            detail: "no node is up".into(),
        });
    }
    // Emptiest first; ties broken by name so placement is deterministic.
    pool.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.name.cmp(&b.name)));
    if pool[0].holds(req.size) {
        return Ok(vec![Planned {
            node: pool[0].name.clone(),
            alloc_offset: 0,
            len: req.size,
        }]);
    }
    let mut plan = Vec::new();
    let mut offset = 0;
    for node in pool {
        let room = node.room();
        let len = room.min(req.size - offset);
        if len == 0 {
            continue;
        }
        plan.push(Planned {
            node: node.name.clone(),
            alloc_offset: offset,
            len,
        });
        offset += len;
        if offset == req.size {
            return Ok(plan);
        }
    }
    Err(exhausted(req.size, nodes))
}

fn lookup<'n>(nodes: &'n [Candidate], name: &str) -> Result<&'n Candidate, CoreError> {
    let node = nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| CoreError::UnknownNode {
            name: name.to_string(),
            known: nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    if !node.up {
        return Err(CoreError::NodeDown(name.to_string()));
    }
    Ok(node)
}

fn fits(size: u64, chosen: &[&Candidate], all: &[Candidate]) -> Result<(), CoreError> {
    if chosen.iter().all(|n| n.holds(size)) {
        Ok(())
    } else {
        Err(exhausted(size, all))
    }
}

fn exhausted(size: u64, nodes: &[Candidate]) -> CoreError {
    let detail = if nodes.is_empty() {
        "no node has joined".to_string()
    } else {
        let total: u64 = nodes.iter().filter(|n| n.up).map(|n| n.free).sum();
        let per: Vec<String> = nodes
            .iter()
            .map(|n| {
                let down = if n.up { "" } else { " (down)" };
                format!("{} {}{down}", n.name, HumanBytes(n.free))
            })
            .collect();
        format!("{} free in total: {}", HumanBytes(total), per.join(", "))
    };
    CoreError::CapacityExhausted {
        requested: size,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const P: u64 = oncilla_proto::PAGE;

    fn nodes() -> Vec<Candidate> {
        vec![
            Candidate {
                name: "a".into(),
                free: 100 * P,
                up: true,
                page: P,
            },
            Candidate {
                name: "b".into(),
                free: 50 * P,
                up: true,
                page: P,
            },
            Candidate {
                name: "c".into(),
                free: 10 * P,
                up: true,
                page: P,
            },
            Candidate {
                name: "d".into(),
                free: 999 * P,
                up: false,
                page: P,
            },
        ]
    }

    fn req<'a>(size: u64, kind: MemKind, names: &'a [String], origin: &'a str) -> Request<'a> {
        Request {
            size,
            kind,
            nodes: names,
            origin,
        }
    }

    #[test]
    fn local_goes_to_origin() {
        let p = plan(&req(10, MemKind::LocalHost, &[], "c"), &nodes()).unwrap();
        assert_eq!(
            p,
            vec![Planned {
                node: "c".into(),
                alloc_offset: 0,
                len: 10
            }]
        );
        assert!(plan(&req(11 * P, MemKind::LocalHost, &[], "c"), &nodes()).is_err());
        assert!(plan(&req(10, MemKind::LocalHost, &[], ""), &nodes()).is_err());
    }

    #[test]
    fn remote_avoids_origin_and_picks_emptiest() {
        let p = plan(&req(P, MemKind::RemoteHost, &[], "a"), &nodes()).unwrap();
        assert_eq!(p[0].node, "b");
        let p = plan(&req(P, MemKind::RemoteHost, &[], ""), &nodes()).unwrap();
        assert_eq!(p[0].node, "a");
    }

    #[test]
    fn remote_spreads_when_no_node_fits() {
        let p = plan(&req(120 * P, MemKind::RemoteHost, &[], ""), &nodes()).unwrap();
        assert_eq!(
            p,
            vec![
                Planned {
                    node: "a".into(),
                    alloc_offset: 0,
                    len: 100 * P
                },
                Planned {
                    node: "b".into(),
                    alloc_offset: 100 * P,
                    len: 20 * P
                },
            ]
        );
        let err = plan(&req(500 * P, MemKind::RemoteHost, &[], ""), &nodes()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("not enough capacity"), "{msg}");
        assert!(
            msg.contains("a 400.0 KiB") && msg.contains("d 3.9 MiB (down)"),
            "{msg}"
        );
    }

    #[test]
    fn named_nodes_split_equally() {
        let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let p = plan(&req(10, MemKind::RemoteHost, &names, ""), &nodes()).unwrap();
        let lens: Vec<u64> = p.iter().map(|x| x.len).collect();
        assert_eq!(lens, vec![4, 4, 2]);
        assert_eq!(p[2].alloc_offset, 8);
        // c cannot hold a third of 60 pages
        assert!(plan(&req(60 * P, MemKind::RemoteHost, &names, ""), &nodes()).is_err());
    }

    #[test]
    fn named_node_errors() {
        let bad = vec!["zz".to_string()];
        let msg = plan(&req(1, MemKind::RemoteHost, &bad, ""), &nodes())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("unknown node \"zz\"") && msg.contains("a, b, c, d"),
            "{msg}"
        );
        let down = vec!["d".to_string()];
        assert!(matches!(
            plan(&req(1, MemKind::RemoteHost, &down, ""), &nodes()),
            Err(CoreError::NodeDown(_))
        ));
        let twice = vec!["a".to_string(), "a".to_string()];
        assert!(plan(&req(1, MemKind::RemoteHost, &twice, ""), &nodes()).is_err());
        assert!(plan(&req(0, MemKind::RemoteHost, &[], ""), &nodes()).is_err());
    }
}
