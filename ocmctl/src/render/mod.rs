//! What ocmctl shows: the master's records as tables for people and JSON
//! for scripts. Every function is pure (records in, text out; the time is
//! an argument), so snapshot tests pin the output. It never calls the
//! master and never decides anything about the cluster.

pub mod allocs;
pub mod nodes;
pub mod quota;

/// Now, in unix milliseconds (what ages are measured against).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long before `now_ms` a unix-ms time was, e.g. "12s", "3m4s".
pub(crate) fn age(created_ms: u64, now_ms: u64) -> String {
    let secs = now_ms.saturating_sub(created_ms) / 1000;
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
    }
}

#[cfg(test)]
mod tests;
