//! Allocations for people (a table, one in detail) and for scripts (JSON).
//! Pure: the caller says what time it is, so the same records always
//! render the same text.

use oncilla_model::alloc::{Allocation, Health};
use oncilla_model::size::HumanBytes;
use oncilla_ops::Table;
use serde_json::{json, Value};

fn placement(a: &Allocation) -> String {
    let p = &a.placement;
    let mut out = if p.nodes.is_empty() {
        p.policy.name().to_string()
    } else {
        let nodes: Vec<String> = p
            .nodes
            .iter()
            .map(|n| format!("{}x{}", n.node, n.weight.max(1)))
            .collect();
        format!("nodes {}", nodes.join(" "))
    };
    if p.stripe != 0 {
        out.push_str(&format!(", stripe {}", HumanBytes(p.stripe)));
    }
    if p.copies() > 1 {
        out.push_str(&format!(", {} copies", p.copies()));
    }
    out
}

/// Per node, in order of first appearance (the primary's extents, then
/// the replicas'): bytes held and extent count.
fn per_node(a: &Allocation) -> Vec<(&str, u64, usize)> {
    let mut out: Vec<(&str, u64, usize)> = Vec::new();
    for e in a.all_extents() {
        match out.iter_mut().find(|(n, _, _)| *n == e.node) {
            Some(entry) => {
                entry.1 += e.len;
                entry.2 += 1;
            }
            None => out.push((&e.node, e.len, 1)),
        }
    }
    out
}

fn attached(a: &Allocation) -> String {
    if a.attached.is_empty() {
        return "-".into();
    }
    a.attached
        .iter()
        .map(|o| format!("pid {} {}@{}", o.pid, o.program, o.node))
        .collect::<Vec<_>>()
        .join(", ")
}

fn health(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Degraded => "degraded",
        Health::Lost => "lost",
    }
}

fn owner(a: &Allocation) -> String {
    a.owner.as_ref().map_or_else(
        || "persistent".to_string(),
        |o| format!("{} (pid {} {}@{})", o.session_id, o.pid, o.program, o.node),
    )
}

/// Allocations as a table, their ages as of `now_ms`.
pub fn table(allocs: &[Allocation], now_ms: u64) -> String {
    let mut t = Table::new(&[
        "ID", "NAME", "SIZE", "KIND", "EXTENTS", "OWNER", "ATTACHED", "HEALTH", "AGE",
    ]);
    for a in allocs {
        let extents: Vec<String> = per_node(a)
            .into_iter()
            .map(|(node, len, n)| match n {
                1 => format!("{node}:{}", HumanBytes(len)),
                n => format!("{node}:{}[{n}]", HumanBytes(len)),
            })
            .collect();
        t.row(vec![
            a.id.to_string(),
            if a.name.is_empty() {
                "-".into()
            } else {
                a.name.clone()
            },
            HumanBytes(a.size).to_string(),
            a.kind.name().to_string(),
            extents.join(" "),
            owner(a),
            a.attached.len().to_string(),
            health(a.health).to_string(),
            super::age(a.created_unix_ms, now_ms),
        ]);
    }
    t.render()
}

/// One allocation as JSON (the access key is never shown).
pub fn json(a: &Allocation) -> Value {
    json!({
        "id": a.id,
        "name": (!a.name.is_empty()).then_some(&a.name),
        "size": a.size,
        "kind": a.kind.name(),
        "placement": placement(a),
        "persistent": a.owner.is_none(),
        "attached": a.attached.iter().map(|o| json!({
            "session_id": o.session_id, "node": o.node, "pid": o.pid, "program": o.program,
            "uid": o.uid,
        })).collect::<Vec<_>>(),
        "owner": a.owner.as_ref().map(|o| json!({
            "session_id": o.session_id, "node": o.node, "pid": o.pid, "program": o.program,
            "uid": o.uid,
        })),
        "created_unix_ms": a.created_unix_ms,
        "user": a.user,
        "shared": a.shared,
        "origin_node": (!a.origin_node.is_empty()).then_some(&a.origin_node),
        "health": health(a.health),
        "health_notes": a.health_notes,
        "moving": a.moving,
        "replicas": a.placement.copies(),
        "extents": a.all_extents().map(|e| json!({
            "node": e.node, "alloc_offset": e.alloc_offset, "len": e.len,
            "pool_offset": e.pool_offset, "data_addr": e.data_addr,
            "fabric": e.fabric.name(), "gpu": e.gpu, "copy": e.copy,
        })).collect::<Vec<_>>(),
    })
}

/// One allocation in detail, its age as of `now_ms`.
pub fn detail(a: &Allocation, now_ms: u64) -> String {
    let mut out = format!(
        "id:        {}\nname:      {}\nsize:      {} ({} bytes)\nkind:      {}\nplacement: {}\nowner:     {}\nattached:  {}\ncreated:   {} ({} ago)\nhealth:    {}\n{}\n",
        a.id,
        if a.name.is_empty() { "-" } else { &a.name },
        HumanBytes(a.size),
        a.size,
        a.kind.name(),
        placement(a),
        owner(a),
        attached(a),
        super::utc(a.created_unix_ms),
        super::age(a.created_unix_ms, now_ms),
        health(a.health),
        a.health_notes
            .iter()
            .map(|n| format!("           {n}\n"))
            .collect::<String>()
    );
    // FABRIC: what the creating process uses for the extent (shm on its
    // own node, tcp elsewhere, unless it chose otherwise).
    // COPY: 0 is the primary, which takes every write; replicas follow.
    let mut t = Table::new(&[
        "COPY",
        "NODE",
        "OFFSET",
        "LENGTH",
        "POOL OFFSET",
        "DATA",
        "FABRIC",
    ]);
    for e in a.all_extents() {
        t.row(vec![
            e.copy.to_string(),
            e.node.clone(),
            e.alloc_offset.to_string(),
            e.len.to_string(),
            e.gpu
                .map_or_else(|| e.pool_offset.to_string(), |g| format!("GPU {g}")),
            e.data_addr.clone(),
            e.fabric.name().to_string(),
        ]);
    }
    out.push_str(&t.render());
    out
}
