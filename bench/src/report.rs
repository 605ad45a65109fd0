//! Numbers and bytes every benchmark shares: percentiles, bandwidth,
//! `--size` lists, deterministic patterns and JSON printing. It measures
//! nothing and talks to no cluster.

use std::time::Duration;

use oncilla_model::size::parse_size;

use crate::BenchError;

/// Bytes per `d`, in GiB/s.
pub fn gib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / f64::from(1u32 << 30)
}

/// The `p`th percentile (nearest rank) of `samples`.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// The `--size` values given, parsed, or `default` when there are none.
///
/// # Errors
/// A size that does not parse.
pub fn sizes_or(given: &[String], default: &[u64]) -> Result<Vec<u64>, BenchError> {
    if given.is_empty() {
        return Ok(default.to_vec());
    }
    given
        .iter()
        .map(|s| parse_size(s).map_err(|e| BenchError::Usage(format!("--size {s}: {e}"))))
        .collect()
}

/// Deterministic, position-dependent bytes, so a misplaced chunk shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        let x = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        v.extend_from_slice(&x.to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// The master's CPU time so far (user and kernel).
pub(crate) fn master_cpu(pid: u32) -> Result<std::time::Duration, BenchError> {
    oncilla_cluster::procfs::cpu(pid)
        .ok_or_else(|| BenchError::Failed("cannot read the master's CPU time from /proc".into()))
}

/// The master's resident memory, in bytes.
pub(crate) fn master_rss(pid: u32) -> Result<u64, BenchError> {
    oncilla_cluster::procfs::rss(pid)
        .ok_or_else(|| BenchError::Failed("cannot read the master's memory from /proc".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&s, 50.0), 50.0);
        assert_eq!(pct(&s, 99.0), 99.0);
        assert_eq!(pct(&[3.0], 99.0), 3.0);
        assert_eq!(pct(&[], 50.0), 0.0);
    }

    #[test]
    fn options_outside_their_range_say_which_and_where() {
        assert_eq!(super::within("--probe", 5usize, 1..=10).unwrap(), 5);
        let err = super::within("--iterations", 0usize, 1..=10_000).unwrap_err();
        assert_eq!(err.to_string(), "--iterations must be between 1 and 10000");
    }
}

/// What a figure was measured on, printed beside it so figures from
/// different machines are not mixed up: this machine's cores, and the
/// page size of each node's pool (2 MiB or 1 GiB: huge pages).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub cores: usize,
    /// Pool page size in bytes, per node.
    pub pool_pages: std::collections::BTreeMap<String, u64>,
}

impl Machine {
    /// This machine, with the pools of `nodes`.
    pub fn of(nodes: &[oncilla_model::node::NodeStatus]) -> Self {
        Self {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            pool_pages: nodes
                .iter()
                .map(|n| (n.info.name.clone(), n.info.page()))
                .collect(),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let huge = self
            .pool_pages
            .iter()
            .filter(|(_, &p)| p > oncilla_model::PAGE)
            .map(|(n, &p)| format!("{n} ({})", oncilla_model::size::HumanBytes(p)))
            .collect::<Vec<_>>();
        let pages = if huge.is_empty() {
            "no huge pages in any pool".to_string()
        } else {
            format!("huge pages in the pools of {}", huge.join(", "))
        };
        write!(f, "machine: {} cores; {pages}", self.cores)
    }
}

/// `value` of the option `flag` when it lies in `range`, else the usage
/// error every benchmark gives ("--FLAG must be between A and B").
///
/// # Errors
/// [`BenchError::Usage`] for a value outside `range`.
pub fn within<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, BenchError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(BenchError::Usage(format!(
            "{flag} must be between {} and {}",
            range.start(),
            range.end()
        )))
    }
}
