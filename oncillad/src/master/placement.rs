//! Placement: which nodes hold which bytes of a new allocation.
//!
//! A pure function of the request and the nodes' free space, so every rule
//! is unit-tested without a cluster. Placement first chooses each node's
//! share (the policy, or the named nodes and their weights), then lays the
//! shares out as byte ranges (one contiguous range per node, or stripes in
//! turn). It never reserves anything itself; the master does that with the
//! plan this returns.

use oncilla_proto::pb::{MemKind, Placement, Policy};
use oncilla_proto::size::HumanBytes;

use crate::error::CoreError;
use crate::pool::round_up;

/// Stripe units are whole multiples of this, so every stripe starts on a
/// base page of the allocation.
pub const STRIPE_ALIGN: u64 = 4096;
/// Most ranges one allocation may be cut into.
pub const MAX_RANGES: u64 = 1 << 16;

/// A node as placement sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub free: u64,
    pub up: bool,
    /// The node's pool page size: its share takes whole pages.
    pub page: u64,
}

impl Candidate {
    /// Whether `len` bytes fit here.
    fn holds(&self, len: u64) -> bool {
        round_up(len, self.page) <= self.free
    }

    /// The most whole pages' worth this node can take.
    fn room(&self) -> u64 {
        self.free / self.page.max(1) * self.page.max(1)
    }
}

/// What one node holds of a new allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub node: String,
    /// `(alloc_offset, len)`, ascending.
    pub ranges: Vec<(u64, u64)>,
}

impl Planned {
    /// Bytes of the allocation on this node.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

/// What is being asked for.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub size: u64,
    pub kind: MemKind,
    pub placement: &'a Placement,
    /// The requesting node; empty when the request comes from an operator.
    pub origin: &'a str,
}

/// Plans an allocation.
///
/// - `LOCAL_HOST`: all of it on the origin node.
/// - `REMOTE_HOST` with named nodes: shares by weight, each node must hold
///   its share.
/// - `REMOTE_HOST` by policy: see [`Policy`]; down nodes get nothing.
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
    let p = req.placement;
    let policy = Policy::try_from(p.policy).unwrap_or(Policy::Unspecified);
    if !p.stripe.is_multiple_of(STRIPE_ALIGN) {
        return Err(CoreError::InvalidArgument(format!(
            "stripe unit {} is not a multiple of {}",
            p.stripe,
            HumanBytes(STRIPE_ALIGN)
        )));
    }
    if p.stripe != 0 && req.size.div_ceil(p.stripe) > MAX_RANGES {
        return Err(CoreError::InvalidArgument(format!(
            "stripe unit {} cuts {} into {} pieces; use a unit of at least {}",
            HumanBytes(p.stripe),
            HumanBytes(req.size),
            req.size.div_ceil(p.stripe),
            HumanBytes(round_up(req.size.div_ceil(MAX_RANGES), STRIPE_ALIGN))
        )));
    }
    if p.stripe != 0 && p.nodes.is_empty() && policy != Policy::Spread {
        return Err(CoreError::InvalidArgument(
            "a stripe unit needs the spread policy or named nodes".into(),
        ));
    }
    let shares = match req.kind {
        MemKind::LocalHost => {
            if !p.nodes.is_empty() || !matches!(policy, Policy::Unspecified | Policy::LocalFirst) {
                return Err(CoreError::InvalidArgument(
                    "local memory goes on the requester's node; placement applies to the remote kind".into(),
                ));
            }
            if req.origin.is_empty() {
                return Err(CoreError::InvalidArgument(
                    "a local allocation needs a local agent; ask through a session".into(),
                ));
            }
            let node = lookup(nodes, req.origin)?;
            if !node.holds(req.size) {
                return Err(exhausted(req.size, nodes));
            }
            vec![(node, 1)]
        }
        MemKind::RemoteHost if !p.nodes.is_empty() => named(p, nodes)?,
        MemKind::RemoteHost => {
            let up: Vec<&Candidate> = nodes.iter().filter(|n| n.up).collect();
            if up.is_empty() {
                return Err(CoreError::CapacityExhausted {
                    requested: req.size,
                    detail: "no node is up".into(),
                });
            }
            let fill = match policy {
                Policy::Unspecified | Policy::LocalFirst => local_first(req, &up),
                Policy::Pack => pack(req.size, &up),
                Policy::Spread => {
                    let shares = spread(req.size, &up).ok_or_else(|| exhausted(req.size, nodes))?;
                    return layout(req.size, p.stripe, &shares, nodes);
                }
            };
            return fill.ok_or_else(|| exhausted(req.size, nodes));
        }
        MemKind::Unspecified => {
            return Err(CoreError::InvalidArgument(
                "memory kind not given (local or remote host)".into(),
            ))
        }
    };
    layout(req.size, p.stripe, &shares, nodes)
}

/// Nodes by weight, in the order named.
fn named<'n>(
    p: &Placement,
    nodes: &'n [Candidate],
) -> Result<Vec<(&'n Candidate, u64)>, CoreError> {
    let mut chosen: Vec<(&Candidate, u64)> = Vec::with_capacity(p.nodes.len());
    for share in &p.nodes {
        if chosen.iter().any(|(c, _)| c.name == share.node) {
            return Err(CoreError::InvalidArgument(format!(
                "node {:?} named twice",
                share.node
            )));
        }
        chosen.push((lookup(nodes, &share.node)?, u64::from(share.weight.max(1))));
    }
    Ok(chosen)
}

/// The origin if it holds everything, else the emptiest node that does,
/// else fill the origin and then the emptiest others.
fn local_first(req: &Request<'_>, up: &[&Candidate]) -> Option<Vec<Planned>> {
    let origin = up.iter().copied().find(|n| n.name == req.origin);
    if let Some(o) = origin.filter(|o| o.holds(req.size)) {
        return Some(whole(o, req.size));
    }
    let mut order = emptiest_first(up);
    if let Some(n) = order.iter().find(|n| n.holds(req.size)) {
        return Some(whole(n, req.size));
    }
    if let Some(o) = origin {
        order.retain(|n| n.name != o.name);
        order.insert(0, o);
    }
    fill(req.size, &order)
}

/// The tightest node that holds everything, else the emptiest first.
fn pack(size: u64, up: &[&Candidate]) -> Option<Vec<Planned>> {
    let tightest = up
        .iter()
        .filter(|n| n.holds(size))
        .min_by(|a, b| a.free.cmp(&b.free).then_with(|| a.name.cmp(&b.name)));
    match tightest {
        Some(n) => Some(whole(n, size)),
        None => fill(size, &emptiest_first(up)),
    }
}

/// Equal shares on every node that has room for one.
fn spread<'n>(size: u64, up: &[&'n Candidate]) -> Option<Vec<(&'n Candidate, u64)>> {
    let mut chosen = emptiest_first(up);
    // Drop the fullest node until every remaining one holds an equal share.
    while let Some(last) = chosen.last() {
        let share = size.div_ceil(chosen.len() as u64);
        if last.holds(share) {
            return Some(chosen.into_iter().map(|n| (n, 1)).collect());
        }
        chosen.pop();
    }
    None
}

fn emptiest_first<'n>(up: &[&'n Candidate]) -> Vec<&'n Candidate> {
    let mut order = up.to_vec();
    // Emptiest first; ties broken by name so placement is deterministic.
    order.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.name.cmp(&b.name)));
    order
}

fn whole(node: &Candidate, size: u64) -> Vec<Planned> {
    vec![Planned {
        node: node.name.clone(),
        ranges: vec![(0, size)],
    }]
}

/// Fills nodes in `order` up to their room until `size` is covered.
fn fill(size: u64, order: &[&Candidate]) -> Option<Vec<Planned>> {
    let mut plan = Vec::new();
    let mut offset = 0;
    for node in order {
        let len = node.room().min(size - offset);
        if len == 0 {
            continue;
        }
        plan.push(Planned {
            node: node.name.clone(),
            ranges: vec![(offset, len)],
        });
        offset += len;
        if offset == size {
            return Some(plan);
        }
    }
    None
}

/// Lays weighted shares out as ranges: one contiguous range per node
/// (`stripe` 0), or `stripe`-sized chunks dealt in turn, each node taking
/// `weight` chunks per turn. Every node must hold what it gets.
fn layout(
    size: u64,
    stripe: u64,
    shares: &[(&Candidate, u64)],
    all: &[Candidate],
) -> Result<Vec<Planned>, CoreError> {
    let total: u64 = shares.iter().map(|s| s.1).sum();
    let mut plan: Vec<Planned> = shares
        .iter()
        .map(|(n, _)| Planned {
            node: n.name.clone(),
            ranges: Vec::new(),
        })
        .collect();
    if stripe == 0 {
        let mut offset = 0;
        for (i, (_, weight)) in shares.iter().enumerate() {
            let len = if i + 1 == shares.len() {
                size - offset
            } else {
                // Proportional, rounded to a base page so ranges stay aligned.
                let exact = u128::from(size) * u128::from(*weight) / u128::from(total);
                let len = u64::try_from(exact).unwrap_or(size);
                (len / STRIPE_ALIGN * STRIPE_ALIGN).min(size - offset)
            };
            if len > 0 {
                plan[i].ranges.push((offset, len));
            }
            offset += len;
        }
    } else {
        let mut offset = 0;
        'deal: loop {
            for (i, (_, weight)) in shares.iter().enumerate() {
                for _ in 0..*weight {
                    if offset >= size {
                        break 'deal;
                    }
                    let len = stripe.min(size - offset);
                    plan[i].ranges.push((offset, len));
                    offset += len;
                }
            }
        }
    }
    for (p, (node, _)) in plan.iter().zip(shares) {
        if !node.holds(p.bytes()) {
            return Err(exhausted(size, all));
        }
    }
    plan.retain(|p| !p.ranges.is_empty());
    Ok(plan)
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
    use oncilla_proto::pb::NodeShare;

    const P: u64 = oncilla_proto::PAGE;

    fn node(name: &str, pages: u64, up: bool) -> Candidate {
        Candidate {
            name: name.into(),
            free: pages * P,
            up,
            page: P,
        }
    }

    fn nodes() -> Vec<Candidate> {
        vec![
            node("a", 100, true),
            node("b", 50, true),
            node("c", 10, true),
            node("d", 999, false),
        ]
    }

    fn policy(p: Policy) -> Placement {
        Placement {
            policy: p as i32,
            ..Placement::default()
        }
    }

    fn named_nodes(list: &[(&str, u32)], stripe: u64) -> Placement {
        Placement {
            policy: 0,
            nodes: list
                .iter()
                .map(|(n, w)| NodeShare {
                    node: n.to_string(),
                    weight: *w,
                })
                .collect(),
            stripe,
        }
    }

    fn plan_for(
        size: u64,
        kind: MemKind,
        p: &Placement,
        origin: &str,
    ) -> Result<Vec<Planned>, CoreError> {
        plan(
            &Request {
                size,
                kind,
                placement: p,
                origin,
            },
            &nodes(),
        )
    }

    fn layout_of(plan: &[Planned]) -> Vec<(&str, Vec<(u64, u64)>)> {
        plan.iter()
            .map(|p| (p.node.as_str(), p.ranges.clone()))
            .collect()
    }

    #[test]
    fn local_goes_to_origin_only() {
        let none = Placement::default();
        let p = plan_for(10, MemKind::LocalHost, &none, "c").unwrap();
        assert_eq!(layout_of(&p), [("c", vec![(0, 10)])]);
        assert!(plan_for(11 * P, MemKind::LocalHost, &none, "c").is_err());
        assert!(plan_for(10, MemKind::LocalHost, &none, "").is_err());
        assert!(plan_for(10, MemKind::LocalHost, &policy(Policy::Spread), "c").is_err());
    }

    #[test]
    fn local_first_prefers_origin_then_emptiest_then_fills() {
        let lf = policy(Policy::LocalFirst);
        let p = plan_for(5 * P, MemKind::RemoteHost, &lf, "c").unwrap();
        assert_eq!(layout_of(&p), [("c", vec![(0, 5 * P)])]);
        // Too big for c: the emptiest node that holds it all.
        let p = plan_for(20 * P, MemKind::RemoteHost, &lf, "c").unwrap();
        assert_eq!(layout_of(&p), [("a", vec![(0, 20 * P)])]);
        // Too big for any one node: c first, then emptiest.
        let p = plan_for(120 * P, MemKind::RemoteHost, &lf, "c").unwrap();
        assert_eq!(
            layout_of(&p),
            [
                ("c", vec![(0, 10 * P)]),
                ("a", vec![(10 * P, 100 * P)]),
                ("b", vec![(110 * P, 10 * P)])
            ]
        );
        // The default policy is local-first; operators have no origin.
        let p = plan_for(P, MemKind::RemoteHost, &Placement::default(), "").unwrap();
        assert_eq!(p[0].node, "a");
    }

    #[test]
    fn pack_uses_the_tightest_fit_then_fewest_nodes() {
        let pk = policy(Policy::Pack);
        let p = plan_for(8 * P, MemKind::RemoteHost, &pk, "").unwrap();
        assert_eq!(layout_of(&p), [("c", vec![(0, 8 * P)])]);
        let p = plan_for(40 * P, MemKind::RemoteHost, &pk, "").unwrap();
        assert_eq!(p[0].node, "b");
        let p = plan_for(140 * P, MemKind::RemoteHost, &pk, "").unwrap();
        assert_eq!(
            layout_of(&p),
            [("a", vec![(0, 100 * P)]), ("b", vec![(100 * P, 40 * P)])]
        );
    }

    #[test]
    fn spread_takes_every_node_with_room_for_a_share() {
        let sp = policy(Policy::Spread);
        let p = plan_for(30 * P, MemKind::RemoteHost, &sp, "").unwrap();
        assert_eq!(
            layout_of(&p),
            [
                ("a", vec![(0, 10 * P)]),
                ("b", vec![(10 * P, 10 * P)]),
                ("c", vec![(20 * P, 10 * P)])
            ]
        );
        // c cannot hold a third of 60 pages: a and b split it.
        let p = plan_for(60 * P, MemKind::RemoteHost, &sp, "").unwrap();
        assert_eq!(
            p.iter().map(|x| x.node.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        // Striped: chunks dealt in turn.
        let striped = Placement {
            stripe: P,
            ..policy(Policy::Spread)
        };
        let p = plan_for(7 * P, MemKind::RemoteHost, &striped, "").unwrap();
        assert_eq!(
            layout_of(&p),
            [
                ("a", vec![(0, P), (3 * P, P), (6 * P, P)]),
                ("b", vec![(P, P), (4 * P, P)]),
                ("c", vec![(2 * P, P), (5 * P, P)]),
            ]
        );
    }

    #[test]
    fn named_nodes_split_by_weight_with_optional_stripes() {
        let p = plan_for(
            10,
            MemKind::RemoteHost,
            &named_nodes(&[("a", 1), ("b", 1), ("c", 1)], 0),
            "",
        )
        .unwrap();
        // Shares round to base pages; the last takes the rest.
        assert_eq!(layout_of(&p), [("c", vec![(0, 10)])]);
        let p = plan_for(
            12 * P,
            MemKind::RemoteHost,
            &named_nodes(&[("a", 3), ("b", 1)], 0),
            "",
        )
        .unwrap();
        assert_eq!(
            layout_of(&p),
            [("a", vec![(0, 9 * P)]), ("b", vec![(9 * P, 3 * P)])]
        );
        let p = plan_for(
            5 * P + 1,
            MemKind::RemoteHost,
            &named_nodes(&[("a", 2), ("b", 1)], P),
            "",
        )
        .unwrap();
        assert_eq!(
            layout_of(&p),
            [
                ("a", vec![(0, P), (P, P), (3 * P, P), (4 * P, P)]),
                ("b", vec![(2 * P, P), (5 * P, 1)])
            ]
        );
        // c cannot hold a third of 60 pages.
        let err = plan_for(
            60 * P,
            MemKind::RemoteHost,
            &named_nodes(&[("a", 1), ("b", 1), ("c", 1)], 0),
            "",
        )
        .unwrap_err();
        assert!(err.to_string().contains("c 40.0 KiB"), "{err}");
    }

    #[test]
    fn bad_requests_say_why() {
        let msg = plan_for(1, MemKind::RemoteHost, &named_nodes(&[("zz", 1)], 0), "")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("unknown node \"zz\"") && msg.contains("a, b, c, d"),
            "{msg}"
        );
        assert!(matches!(
            plan_for(1, MemKind::RemoteHost, &named_nodes(&[("d", 1)], 0), ""),
            Err(CoreError::NodeDown(_))
        ));
        assert!(plan_for(
            1,
            MemKind::RemoteHost,
            &named_nodes(&[("a", 1), ("a", 2)], 0),
            ""
        )
        .is_err());
        assert!(plan_for(0, MemKind::RemoteHost, &Placement::default(), "").is_err());
        let odd = Placement {
            stripe: 1000,
            ..policy(Policy::Spread)
        };
        assert!(plan_for(P, MemKind::RemoteHost, &odd, "")
            .unwrap_err()
            .to_string()
            .contains("multiple"));
        let packed = Placement {
            stripe: P,
            ..policy(Policy::Pack)
        };
        assert!(plan_for(P, MemKind::RemoteHost, &packed, "").is_err());
        let tiny = Placement {
            stripe: P,
            ..policy(Policy::Spread)
        };
        let msg = plan_for(1 << 40, MemKind::RemoteHost, &tiny, "")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("use a unit of at least"), "{msg}");
    }

    #[test]
    fn every_policy_reports_exhaustion_with_free_space() {
        for p in [
            policy(Policy::LocalFirst),
            policy(Policy::Pack),
            policy(Policy::Spread),
        ] {
            let err = plan_for(500 * P, MemKind::RemoteHost, &p, "a").unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("not enough capacity"), "{msg}");
            assert!(
                msg.contains("a 400.0 KiB") && msg.contains("d 3.9 MiB (down)"),
                "{msg}"
            );
        }
    }
}
