//! Nodes for people (a table) and for scripts (JSON). Pure: the same list
//! always renders the same text.

use oncilla_model::node::{NodeInfo, NodeList, NodeStatus};
use oncilla_model::size::HumanBytes;
use oncilla_ops::Table;
use serde_json::{json, Value};

/// Nodes as a table followed by its notes (what `top` and `demo` show).
pub fn table(list: &NodeList, now_ms: u64) -> String {
    let (table, notes) = table_and_notes(list, now_ms);
    table + &notes
}

/// Nodes as a table (how long each has been in its state as of `now_ms`),
/// and apart the notes about it, a line each: pools that fell back from
/// huge pages, missing GPUs or verbs, GPUDirect, why a drained node's
/// allocation could not move yet, a master still recovering (`ocmctl
/// nodes` prints them on stderr).
pub fn table_and_notes(list: &NodeList, now_ms: u64) -> (String, String) {
    let nodes = &list.nodes;
    let mut t = Table::new(&[
        "NAME",
        "ZONE",
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
        if let Some(d) = n.drain.as_ref().filter(|d| !d.note.is_empty()) {
            notes.push_str(&format!("{}: draining: {}\n", info.name, d.note));
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
            if info.zone.is_empty() {
                "-".into()
            } else {
                info.zone
            },
            info.agent_addr,
            info.data_addr,
            HumanBytes(info.capacity).to_string(),
            HumanBytes(n.used).to_string(),
            HumanBytes(pool.scrubbing).to_string(),
            HumanBytes(free).to_string(),
            HumanBytes(pool.largest_free).to_string(),
            pages,
            state_cell(n),
            super::age(n.state_since_unix_ms, now_ms),
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
    (t.render(), notes)
}

/// A node's state, and how far its drain is: `up`, `up, draining (3
/// left)`, `up, drained` (it holds nothing: it may be stopped).
fn state_cell(n: &NodeStatus) -> String {
    let state = n.state.name();
    match &n.drain {
        None => state.to_string(),
        Some(d) if d.left == 0 => format!("{state}, drained"),
        Some(d) => format!("{state}, draining ({} left)", d.left),
    }
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
pub fn json(list: &NodeList) -> Value {
    Value::Array(
        list.nodes
            .iter()
            .map(|n| {
                let info = &n.info;
                let pool = n.pool;
                json!({
                    "name": info.name,
                    "zone": (!info.zone.is_empty()).then_some(&info.zone),
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
                    "drain": n.drain.as_ref().map(|d| json!({
                        "left": d.left,
                        "note": (!d.note.is_empty()).then_some(&d.note),
                    })),
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
