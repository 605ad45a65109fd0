//! Placement: which nodes hold which bytes of a new allocation.
//!
//! A pure function of the request and the nodes' free space, so every rule
//! is unit-tested without a cluster. Placement first chooses each node's
//! share (the policy, or the named nodes and their weights), then lays the
//! shares out as byte ranges (one contiguous range per node, or stripes in
//! turn). It never reserves anything itself; the master does that with the
//! plan this returns.

use oncilla_model::alloc::{Placement, MAX_EXTENTS};
use oncilla_model::size::HumanBytes;
use oncilla_model::{Kind, Policy};

use crate::error::CoreError;
use oncilla_model::size::round_up;

/// Stripe units are whole multiples of this, so every stripe starts on a
/// base page of the allocation.
pub const STRIPE_ALIGN: u64 = 4096;

/// A node as placement sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub free: u64,
    pub up: bool,
    /// Being drained: nothing new goes there.
    pub draining: bool,
    /// The node's pool page size: its share takes whole pages.
    pub page: u64,
    /// The node's GPUs with the device memory placement may still give.
    pub gpus: Vec<GpuRoom>,
    /// Why the node has no GPU (empty when it has some).
    pub gpu_note: String,
    /// The failure domain it declared (empty: none).
    pub zone: String,
}

/// One GPU as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRoom {
    pub index: u32,
    /// Free device memory at the node's start, less what the master placed.
    pub free: u64,
}

impl Candidate {
    /// Whether `len` bytes fit here.
    fn holds(&self, len: u64) -> bool {
        round_up(len, self.page) <= self.free
    }

    /// The most whole pages' worth this node can take.
    /// Whether new memory may go here: up, and not being drained.
    fn placeable(&self) -> bool {
        self.up && !self.draining
    }

    /// How it is shown beside its room when placement fails.
    fn condition(&self) -> &'static str {
        match (self.up, self.draining) {
            (false, _) => " (down)",
            (true, true) => " (draining)",
            (true, false) => "",
        }
    }

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
    /// GPU kinds: the device that holds it all (one range).
    pub gpu: Option<u32>,
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
    pub kind: Kind,
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
/// - GPU kinds: the whole allocation on one device ([`gpu`]).
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
    let policy = p.policy;
    if !p.stripe.is_multiple_of(STRIPE_ALIGN) {
        return Err(CoreError::InvalidArgument(format!(
            "stripe unit {} is not a multiple of {}",
            p.stripe,
            HumanBytes(STRIPE_ALIGN)
        )));
    }
    if p.stripe != 0 && req.size.div_ceil(p.stripe) > MAX_EXTENTS as u64 {
        return Err(CoreError::InvalidArgument(format!(
            "stripe unit {} cuts {} into {} pieces; use a unit of at least {}",
            HumanBytes(p.stripe),
            HumanBytes(req.size),
            req.size.div_ceil(p.stripe),
            HumanBytes(round_up(
                req.size.div_ceil(MAX_EXTENTS as u64),
                STRIPE_ALIGN
            ))
        )));
    }
    if p.stripe != 0 && p.nodes.is_empty() && policy != Policy::Spread {
        return Err(CoreError::InvalidArgument(
            "a stripe unit needs the spread policy or named nodes".into(),
        ));
    }
    let shares = match req.kind {
        Kind::LocalGpu | Kind::RemoteGpu => return gpu(req, nodes).map(|p| vec![p]),
        Kind::LocalHost => {
            if !p.nodes.is_empty() || !matches!(policy, Policy::LocalFirst) {
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
        Kind::RemoteHost if !p.nodes.is_empty() => named(p, nodes)?,
        Kind::RemoteHost => {
            let up: Vec<&Candidate> = nodes.iter().filter(|n| n.placeable()).collect();
            if up.is_empty() {
                return Err(CoreError::CapacityExhausted {
                    requested: req.size,
                    detail: "no node is up".into(),
                });
            }
            let fill = match policy {
                Policy::LocalFirst => local_first(req, &up),
                Policy::Pack => pack(req.size, &up),
                Policy::Spread => {
                    let shares = spread(req.size, &up).ok_or_else(|| exhausted(req.size, nodes))?;
                    return layout(req.size, p.stripe, &shares, nodes);
                }
            };
            return fill.ok_or_else(|| exhausted(req.size, nodes));
        }
    };
    layout(req.size, p.stripe, &shares, nodes)
}

/// A GPU allocation lives on one device: `LOCAL_GPU` on the requester's
/// node, `REMOTE_GPU` on the named node or, by policy, on the requester's
/// node when one of its GPUs has room (local first) or the GPU with the
/// least room that holds it (pack); otherwise the GPU with the most room.
/// Without a named device, the device with the most room on the node.
fn gpu(req: &Request<'_>, nodes: &[Candidate]) -> Result<Planned, CoreError> {
    let p = req.placement;
    let policy = p.policy;
    if p.stripe != 0 || policy == Policy::Spread {
        return Err(CoreError::InvalidArgument(
            "a GPU allocation lives on one device; spread and stripes apply to host memory".into(),
        ));
    }
    let node = if req.kind == Kind::LocalGpu {
        if !p.nodes.is_empty() || !matches!(policy, Policy::LocalFirst) {
            return Err(CoreError::InvalidArgument(
                "local GPU memory goes on the requester's node; name a device with `gpu` only"
                    .into(),
            ));
        }
        if req.origin.is_empty() {
            return Err(CoreError::InvalidArgument(
                "local GPU memory lives in the requesting process; ask through a session".into(),
            ));
        }
        Some(lookup(nodes, req.origin)?)
    } else {
        match p.nodes.as_slice() {
            [] => None,
            [one] => Some(lookup(nodes, &one.node)?),
            _ => {
                return Err(CoreError::InvalidArgument(
                    "a GPU allocation lives on one device; name one node".into(),
                ))
            }
        }
    };
    if p.gpu.is_some() && node.is_none() {
        return Err(CoreError::InvalidArgument(
            "a GPU index needs a node: name the node that has it".into(),
        ));
    }
    if let Some(n) = node {
        if n.gpus.is_empty() {
            return Err(CoreError::NoGpu(format!(
                "no GPU: node {}: {}",
                n.name,
                no_gpu_reason(n)
            )));
        }
        let dev = match p.gpu {
            Some(i) => n.gpus.iter().find(|g| g.index == i).ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "node {} has no GPU {i} (it has {})",
                    n.name,
                    n.gpus.len()
                ))
            })?,
            None => roomiest(&n.gpus).ok_or_else(|| gpu_exhausted(req.size, nodes))?,
        };
        if dev.free < req.size {
            return Err(gpu_exhausted(req.size, nodes));
        }
        return Ok(on_gpu(n, dev.index, req.size));
    }
    let up: Vec<&Candidate> = nodes.iter().filter(|n| n.placeable()).collect();
    if up.iter().all(|n| n.gpus.is_empty()) {
        let why: Vec<String> = nodes
            .iter()
            .map(|n| format!("{}: {}", n.name, no_gpu_reason(n)))
            .collect();
        return Err(CoreError::NoGpu(if why.is_empty() {
            "no GPU: no node has joined".into()
        } else {
            format!("no GPU: no node that is up has one ({})", why.join("; "))
        }));
    }
    let fits = |n: &Candidate| n.gpus.iter().any(|g| g.free >= req.size);
    let with_room: Vec<&Candidate> = up.iter().copied().filter(|n| fits(n)).collect();
    let origin = with_room.iter().find(|n| n.name == req.origin);
    let chosen = match (policy, origin) {
        (Policy::LocalFirst, Some(o)) => Some(o),
        (Policy::Pack, _) => with_room.iter().min_by(|a, b| {
            tightest(a, req.size)
                .cmp(&tightest(b, req.size))
                .then_with(|| a.name.cmp(&b.name))
        }),
        _ => with_room.iter().max_by(|a, b| {
            most_room(a)
                .cmp(&most_room(b))
                .then_with(|| b.name.cmp(&a.name))
        }),
    };
    let n = chosen
        .copied()
        .ok_or_else(|| gpu_exhausted(req.size, nodes))?;
    let dev = if policy == Policy::Pack {
        n.gpus
            .iter()
            .filter(|g| g.free >= req.size)
            .min_by_key(|g| (g.free, g.index))
    } else {
        roomiest(&n.gpus)
    };
    let dev = dev.ok_or_else(|| gpu_exhausted(req.size, nodes))?;
    Ok(on_gpu(n, dev.index, req.size))
}

fn on_gpu(n: &Candidate, index: u32, size: u64) -> Planned {
    Planned {
        node: n.name.clone(),
        ranges: vec![(0, size)],
        gpu: Some(index),
    }
}

/// The device with the most room (lowest index on a tie).
fn roomiest(gpus: &[GpuRoom]) -> Option<&GpuRoom> {
    gpus.iter()
        .max_by(|a, b| a.free.cmp(&b.free).then_with(|| b.index.cmp(&a.index)))
}

fn most_room(n: &Candidate) -> u64 {
    n.gpus.iter().map(|g| g.free).max().unwrap_or(0)
}

/// The least room among the node's devices that hold `size`.
fn tightest(n: &Candidate, size: u64) -> u64 {
    n.gpus
        .iter()
        .map(|g| g.free)
        .filter(|f| *f >= size)
        .min()
        .unwrap_or(u64::MAX)
}

fn no_gpu_reason(n: &Candidate) -> &str {
    if n.gpu_note.is_empty() {
        "no GPU"
    } else {
        &n.gpu_note
    }
}

fn gpu_exhausted(size: u64, nodes: &[Candidate]) -> CoreError {
    let per: Vec<String> = nodes
        .iter()
        .flat_map(|n| {
            n.gpus.iter().map(move |g| {
                let down = n.condition();
                format!("{} GPU {} {}{down}", n.name, g.index, HumanBytes(g.free))
            })
        })
        .collect();
    CoreError::CapacityExhausted {
        requested: size,
        detail: if per.is_empty() {
            "no GPU in the cluster".into()
        } else {
            format!("GPU memory free: {}", per.join(", "))
        },
    }
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
        gpu: None,
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
            gpu: None,
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
            gpu: None,
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
    if node.draining {
        return Err(CoreError::NodeDraining(name.to_string()));
    }
    Ok(node)
}

fn exhausted(size: u64, nodes: &[Candidate]) -> CoreError {
    let detail = if nodes.is_empty() {
        "no node has joined".to_string()
    } else {
        let total: u64 = nodes.iter().filter(|n| n.placeable()).map(|n| n.free).sum();
        let per: Vec<String> = nodes
            .iter()
            .map(|n| {
                let down = n.condition();
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

mod replicas;
pub use replicas::{refill, replicas};

#[cfg(test)]
mod tests;
