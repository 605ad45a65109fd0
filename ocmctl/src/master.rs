//! How ocmctl shows the master's wire records (tables and JSON), and the
//! descriptor `put`/`get` copy through; the connection itself is
//! `oncilla_cluster::Master`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use liboncilla::Descriptor;
use oncilla_bench::table::Table;
use oncilla_cluster::Master;
use oncilla_model::alloc::{AllocRef, Allocation, Health};
use oncilla_model::node::{NodeInfo, NodeList, NodeStatus};
use oncilla_model::size::HumanBytes;
use serde_json::{json, Value};

use crate::CliError;

/// A validated descriptor for the data path.
pub fn descriptor(master: &Master, alloc: &AllocRef) -> Result<Descriptor, CliError> {
    Ok(Descriptor::from_record(master.allocation(alloc)?)?)
}

/// An allocation named on the command line: digits are an id, anything
/// else a name (names never consist of digits only).
pub fn alloc_ref(arg: &str) -> AllocRef {
    match arg.parse::<u64>() {
        Ok(id) => AllocRef::Id(id),
        Err(_) => AllocRef::Name(arg.to_string()),
    }
}

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
    out
}

/// Per node, in order of first appearance: bytes held and extent count.
fn per_node(a: &Allocation) -> Vec<(&str, u64, usize)> {
    let mut out: Vec<(&str, u64, usize)> = Vec::new();
    for e in &a.extents {
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

/// How long ago a unix-ms time was, e.g. "12s", "3m4s".
fn age(created_ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    let secs = u64::try_from(now)
        .unwrap_or(u64::MAX)
        .saturating_sub(created_ms)
        / 1000;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Nodes as a table, with a line when the master is still recovering.
pub fn nodes_table(list: &NodeList) -> String {
    let nodes = &list.nodes;
    let mut t = Table::new(&[
        "NAME",
        "ADDRESS",
        "DATA",
        "CAPACITY",
        "USED",
        "SCRUBBING",
        "FREE",
        "LARGEST",
        "PAGES",
        "STATE",
        "SINCE",
        "FABRICS",
        "RDMA",
        "GPUS",
    ]);
    let mut notes = String::new();
    for n in nodes {
        let info = n.info.clone();
        let pool = n.pool;
        let mut pages = HumanBytes(info.page_size).to_string();
        if !info.pool_note.is_empty() {
            pages.push_str(" (fallback)");
            notes.push_str(&format!("{}: {}\n", info.name, info.pool_note));
        }
        let free = free(&info, n);
        let rdma = rdma_cell(&info);
        let gpus = gpu_cell(&info);
        if info.gpu_devices.is_empty() && !info.gpu_note.is_empty() {
            notes.push_str(&format!("{}: no GPU: {}\n", info.name, info.gpu_note));
        }
        if !info.rdma_note.is_empty() && !info.rdma.is_empty() {
            notes.push_str(&format!(
                "{}: verbs unavailable: {}\n",
                info.name, info.rdma_note
            ));
        }
        // GPUDirect matters only where both GPUs and verbs are there.
        if !info.gpu_devices.is_empty() && info.rdma_note.is_empty() {
            if info.gpu_rdma.is_empty() {
                notes.push_str(&format!(
                    "{}: GPU memory goes over tcp, not RDMA: {}\n",
                    info.name, info.gpu_rdma_note
                ));
            } else {
                notes.push_str(&format!(
                    "{}: GPUDirect RDMA: GPU memory registered with the RDMA ports ({})\n",
                    info.name, info.gpu_rdma
                ));
            }
        }
        t.row(vec![
            info.name,
            info.agent_addr,
            info.data_addr,
            HumanBytes(info.capacity).to_string(),
            HumanBytes(n.used).to_string(),
            HumanBytes(pool.scrubbing).to_string(),
            HumanBytes(free).to_string(),
            HumanBytes(pool.largest_free).to_string(),
            pages,
            n.state.name().to_string(),
            age(n.state_since_unix_ms),
            info.fabrics.join(","),
            rdma,
            gpus,
        ]);
    }
    if list.recovering_ms > 0 {
        notes.push_str(&format!(
            "master recovering: allocations and frees wait {} ms more for agents to re-register\n",
            list.recovering_ms
        ));
    }
    t.render() + &notes
}

/// A node's GPUs in one cell: `0:NVIDIA H100 80GB HBM3 79.1 GiB/79.6 GiB`
/// (index, name, free/total), or `-` when it has none.
fn gpu_cell(info: &NodeInfo) -> String {
    if info.gpu_devices.is_empty() {
        return "-".into();
    }
    info.gpu_devices
        .iter()
        .map(|g| {
            format!(
                "{}:{} {}/{}",
                g.index,
                g.name,
                HumanBytes(g.free),
                HumanBytes(g.total)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A node's RDMA ports in one cell: `mlx5_0:1 IB ACTIVE 4096`, or `-`
/// when it has none.
fn rdma_cell(info: &NodeInfo) -> String {
    if info.rdma.is_empty() {
        return "-".into();
    }
    info.rdma
        .iter()
        .map(|p| {
            let layer = if p.link_layer == "Ethernet" {
                "RoCE"
            } else {
                "IB"
            };
            let mtu = if p.active_mtu > 0 {
                format!(" {}", p.active_mtu)
            } else {
                String::new()
            };
            format!("{}:{} {layer} {}{mtu}", p.device, p.port, p.state)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Free bytes of a node: what the master has not placed there, less what
/// the node is still scrubbing.
fn free(info: &NodeInfo, n: &NodeStatus) -> u64 {
    let scrubbing = n.pool.scrubbing;
    info.capacity
        .saturating_sub(n.used)
        .saturating_sub(scrubbing)
}

/// Nodes as JSON.
pub fn nodes_json(list: &NodeList) -> Value {
    Value::Array(
        list.nodes
            .iter()
            .map(|n| {
                let info = &n.info;
                let pool = n.pool;
                json!({
                    "name": info.name,
                    "agent_addr": info.agent_addr,
                    "data_addr": info.data_addr,
                    "capacity": info.capacity,
                    "used": n.used,
                    "scrubbing": pool.scrubbing,
                    "free": free(info, n),
                    "largest_free": pool.largest_free,
                    "page_size": info.page_size,
                    "pool_note": (!info.pool_note.is_empty()).then_some(&info.pool_note),
                    "state": n.state.name(),
                    "state_since_unix_ms": n.state_since_unix_ms,
                    "incarnation": format!("{:016x}", n.incarnation),
                    "fabrics": info.fabrics,
                    "rdma": info.rdma.iter().map(|p| json!({
                        "device": p.device,
                        "port": p.port,
                        "link_layer": p.link_layer,
                        "state": p.state,
                        "active_mtu": p.active_mtu,
                        "gids": p.gids,
                        "numa_node": p.numa_node,
                        "lid": p.lid,
                        "rate": p.rate,
                    })).collect::<Vec<_>>(),
                    "rdma_note": (!info.rdma_note.is_empty()).then_some(&info.rdma_note),
                    "gpus": info.gpu_devices.iter().map(|g| json!({
                        "index": g.index,
                        "name": g.name,
                        "total": g.total,
                        "free": g.free,
                    })).collect::<Vec<_>>(),
                    "gpu_note": (!info.gpu_note.is_empty()).then_some(&info.gpu_note),
                    "gpu_rdma": (!info.gpu_rdma.is_empty()).then_some(&info.gpu_rdma),
                    "gpu_rdma_note": (!info.gpu_rdma_note.is_empty()).then_some(&info.gpu_rdma_note),
                    "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago,
                })
            })
            .collect(),
    )
}

/// Allocations as a table.
pub fn allocs_table(allocs: &[Allocation]) -> String {
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
            age(a.created_unix_ms),
        ]);
    }
    t.render()
}

/// One allocation as JSON (the access key is never shown).
pub fn alloc_json(a: &Allocation) -> Value {
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
        "extents": a.extents.iter().map(|e| json!({
            "node": e.node, "alloc_offset": e.alloc_offset, "len": e.len,
            "pool_offset": e.pool_offset, "data_addr": e.data_addr,
            "fabric": e.fabric.name(), "gpu": e.gpu,
        })).collect::<Vec<_>>(),
    })
}

/// One allocation in detail.
pub fn alloc_detail(a: &Allocation) -> String {
    let mut out = format!(
        "id:        {}\nname:      {}\nsize:      {} ({} bytes)\nkind:      {}\nplacement: {}\nowner:     {}\nattached:  {}\nage:       {}\nhealth:    {}\n{}\n",
        a.id,
        if a.name.is_empty() { "-" } else { &a.name },
        HumanBytes(a.size),
        a.size,
        a.kind.name(),
        placement(a),
        owner(a),
        attached(a),
        age(a.created_unix_ms),
        health(a.health),
        a.health_notes
            .iter()
            .map(|n| format!("           {n}\n"))
            .collect::<String>()
    );
    // FABRIC: what the creating process uses for the extent (shm on its
    // own node, tcp elsewhere, unless it chose otherwise).
    let mut t = Table::new(&["NODE", "OFFSET", "LENGTH", "POOL OFFSET", "DATA", "FABRIC"]);
    for e in &a.extents {
        t.row(vec![
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
