//! Quotas and what each user holds, for people (a table) and for scripts
//! (JSON, `null` for no limit). Pure.

use oncilla_model::quota::{Limits, Report};
use oncilla_model::size::HumanBytes;
use oncilla_ops::Table;
use serde_json::{json, Value};

/// `used / limit` for a table cell.
fn cell(used: Option<String>, limit: Option<String>) -> String {
    format!(
        "{} / {}",
        used.unwrap_or_else(|| "-".into()),
        limit.unwrap_or_else(|| "unlimited".into())
    )
}

fn bytes(v: Option<u64>) -> Option<String> {
    v.map(|b| HumanBytes(b).to_string())
}

fn count(v: Option<u64>) -> Option<String> {
    v.map(|n| n.to_string())
}

/// The quotas as a table: the default first, then each user.
pub fn table(r: &Report) -> String {
    let mut t = Table::new(&[
        "WHO",
        "LIMITS",
        "BYTES",
        "ON ONE NODE",
        "ALLOCATIONS",
        "PERSISTENT",
    ]);
    let d = &r.default;
    t.row(vec![
        "default".into(),
        "-".into(),
        cell(None, bytes(d.bytes)),
        cell(None, bytes(d.node_bytes)),
        cell(None, count(d.allocations)),
        cell(None, count(d.persistent)),
    ]);
    for u in &r.users {
        let l = u.limits.unwrap_or(r.default);
        t.row(vec![
            format!("uid {}", u.uid),
            if u.limits.is_some() { "own" } else { "default" }.into(),
            cell(bytes(Some(u.usage.bytes)), bytes(l.bytes)),
            cell(bytes(Some(u.usage.node_bytes)), bytes(l.node_bytes)),
            cell(count(Some(u.usage.allocations)), count(l.allocations)),
            cell(count(Some(u.usage.persistent)), count(l.persistent)),
        ]);
    }
    t.render()
}

fn limits_json(l: &Limits) -> Value {
    json!({
        "bytes": l.bytes,
        "node_bytes": l.node_bytes,
        "allocations": l.allocations,
        "persistent": l.persistent,
    })
}

/// The quotas as JSON (`null` is no limit).
pub fn json(r: &Report) -> Value {
    json!({
        "persistent": r.persistent,
        "default": limits_json(&r.default),
        "users": r.users.iter().map(|u| json!({
            "uid": u.uid,
            "own_limits": u.limits.is_some(),
            "limits": limits_json(&u.limits.unwrap_or(r.default)),
            "usage": {
                "bytes": u.usage.bytes,
                "node_bytes": u.usage.node_bytes,
                "allocations": u.usage.allocations,
                "persistent": u.usage.persistent,
            },
        })).collect::<Vec<_>>(),
    })
}
