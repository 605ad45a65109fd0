//! Quotas: what one user (a uid, as the agents' Unix sockets see
//! applications) may hold in the cluster, and what a user holds as the
//! master counts it. Allocations made with the cluster token (operators)
//! belong to no user and count against no quota.
//!
//! Pure values and the one check ([`check`]); the master enforces and
//! keeps them, `ocmctl quota` shows and sets them. This module never reads
//! or writes a file.

use std::collections::BTreeMap;
use std::fmt;

use crate::size::HumanBytes;

/// What one user may hold; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Bytes of all the user's allocations, on every node together.
    pub bytes: Option<u64>,
    /// Bytes of the user's allocations on any one node.
    pub node_bytes: Option<u64>,
    /// Allocations, persistent ones included.
    pub allocations: Option<u64>,
    /// Persistent (and named) allocations: they outlive the process that
    /// made them and count against its user until freed.
    pub persistent: Option<u64>,
}

impl Limits {
    /// No limit at all.
    pub const NONE: Limits = Limits {
        bytes: None,
        node_bytes: None,
        allocations: None,
        persistent: None,
    };
}

/// Whose quota: everyone without one of their own, or one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    Default,
    User(u32),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Default => f.write_str("default"),
            Subject::User(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// Every quota: the default and each user's own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Quotas {
    pub default: Limits,
    pub users: BTreeMap<u32, Limits>,
}

impl Quotas {
    /// The limits that apply to `uid`.
    pub fn of(&self, uid: u32) -> &Limits {
        self.users.get(&uid).unwrap_or(&self.default)
    }

    /// Sets `who`'s limits; a user's `None` removes the user's own (the
    /// default applies again).
    pub fn set(&mut self, who: Subject, limits: Option<Limits>) {
        match (who, limits) {
            (Subject::Default, l) => self.default = l.unwrap_or(Limits::NONE),
            (Subject::User(uid), Some(l)) => {
                self.users.insert(uid, l);
            }
            (Subject::User(uid), None) => {
                self.users.remove(&uid);
            }
        }
    }
}

/// What one allocation counts against its user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Charge {
    /// Its size.
    pub bytes: u64,
    /// Its bytes on each node.
    pub nodes: BTreeMap<String, u64>,
    pub persistent: bool,
}

/// What one user holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    pub bytes: u64,
    /// Bytes on each node (nodes with none left are dropped).
    pub nodes: BTreeMap<String, u64>,
    pub allocations: u64,
    pub persistent: u64,
}

impl Usage {
    pub fn add(&mut self, c: &Charge) {
        self.bytes = self.bytes.saturating_add(c.bytes);
        for (node, b) in &c.nodes {
            let n = self.nodes.entry(node.clone()).or_default();
            *n = n.saturating_add(*b);
        }
        self.allocations += 1;
        self.persistent += u64::from(c.persistent);
    }

    pub fn sub(&mut self, c: &Charge) {
        self.bytes = self.bytes.saturating_sub(c.bytes);
        for (node, b) in &c.nodes {
            if let Some(n) = self.nodes.get_mut(node) {
                *n = n.saturating_sub(*b);
                if *n == 0 {
                    self.nodes.remove(node);
                }
            }
        }
        self.allocations = self.allocations.saturating_sub(1);
        self.persistent = self.persistent.saturating_sub(u64::from(c.persistent));
    }

    /// The most bytes on any one node.
    pub fn node_bytes(&self) -> u64 {
        self.nodes.values().copied().max().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.allocations == 0 && self.bytes == 0
    }
}

/// What one user holds, as `ocmctl quota` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub bytes: u64,
    /// The most bytes on any one node.
    pub node_bytes: u64,
    pub allocations: u64,
    pub persistent: u64,
}

impl From<&Usage> for Summary {
    fn from(u: &Usage) -> Self {
        Self {
            bytes: u.bytes,
            node_bytes: u.node_bytes(),
            allocations: u.allocations,
            persistent: u.persistent,
        }
    }
}

/// One user in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserReport {
    pub uid: u32,
    /// The user's own limits; `None`: the default applies.
    pub limits: Option<Limits>,
    pub usage: Summary,
}

/// Every quota and what each user holds: the default, then each user with
/// limits of their own or allocations, by uid.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub default: Limits,
    pub users: Vec<UserReport>,
    /// Whether the master keeps quotas across restarts (in a file); they
    /// can be set only then.
    pub persistent: bool,
}

impl Report {
    /// The report of `quotas` with `usage`.
    pub fn new(quotas: &Quotas, usage: &BTreeMap<u32, Usage>, persistent: bool) -> Self {
        let mut uids: Vec<u32> = quotas.users.keys().chain(usage.keys()).copied().collect();
        uids.sort_unstable();
        uids.dedup();
        Self {
            default: quotas.default,
            users: uids
                .into_iter()
                .map(|uid| UserReport {
                    uid,
                    limits: quotas.users.get(&uid).copied(),
                    usage: usage.get(&uid).map(Summary::from).unwrap_or_default(),
                })
                .collect(),
            persistent,
        }
    }
}

/// A request past a quota, said so its user (and the operator) can act.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quota exceeded for uid {uid}: {what} would be {would} with this allocation, above the limit of {limit} ({used} in use); free some, or ask an operator (`ocmctl quota`)")]
pub struct Exceeded {
    pub uid: u32,
    /// Which limit, as `ocmctl quota set` names it (and the node for
    /// `node-bytes`).
    pub what: String,
    pub limit: Amount,
    pub used: Amount,
    pub would: Amount,
}

/// A quantity in a quota message: bytes or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Bytes(u64),
    Count(u64),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Bytes(b) => write!(f, "{}", HumanBytes(*b)),
            Amount::Count(n) => write!(f, "{n}"),
        }
    }
}

/// Whether user `uid`, holding `usage`, may take `charge` under `limits`.
///
/// # Errors
/// The first limit it would pass: allocations, persistent allocations,
/// bytes, then bytes on a node.
pub fn check(uid: u32, limits: &Limits, usage: &Usage, charge: &Charge) -> Result<(), Exceeded> {
    let over =
        |what: String, limit: Option<u64>, used: u64, more: u64, amount: fn(u64) -> Amount| {
            match limit {
                Some(l) if used.saturating_add(more) > l => Err(Exceeded {
                    uid,
                    what,
                    limit: amount(l),
                    used: amount(used),
                    would: amount(used.saturating_add(more)),
                }),
                _ => Ok(()),
            }
        };
    over(
        "allocations".into(),
        limits.allocations,
        usage.allocations,
        1,
        Amount::Count,
    )?;
    if charge.persistent {
        over(
            "persistent allocations".into(),
            limits.persistent,
            usage.persistent,
            1,
            Amount::Count,
        )?;
    }
    over(
        "bytes".into(),
        limits.bytes,
        usage.bytes,
        charge.bytes,
        Amount::Bytes,
    )?;
    for (node, b) in &charge.nodes {
        let used = usage.nodes.get(node).copied().unwrap_or(0);
        over(
            format!("bytes on node {node}"),
            limits.node_bytes,
            used,
            *b,
            Amount::Bytes,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(bytes: u64, nodes: &[(&str, u64)], persistent: bool) -> Charge {
        Charge {
            bytes,
            nodes: nodes.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
            persistent,
        }
    }

    #[test]
    fn each_limit_is_checked_with_what_is_in_use() {
        let limits = Limits {
            bytes: Some(10 << 20),
            node_bytes: Some(6 << 20),
            allocations: Some(3),
            persistent: Some(1),
        };
        let mut usage = Usage::default();
        let a = charge(4 << 20, &[("n1", 4 << 20)], true);
        assert!(check(7, &limits, &usage, &a).is_ok());
        usage.add(&a);
        let e = check(7, &limits, &usage, &charge(1, &[("n2", 1)], true)).unwrap_err();
        assert_eq!(e.what, "persistent allocations");
        assert!(
            e.to_string().contains("uid 7") && e.to_string().contains("limit of 1"),
            "{e}"
        );
        let e = check(
            7,
            &limits,
            &usage,
            &charge(3 << 20, &[("n1", 3 << 20)], false),
        )
        .unwrap_err();
        assert_eq!(e.what, "bytes on node n1");
        assert!(e.to_string().contains("7.0 MiB"), "{e}");
        // Elsewhere it fits.
        let b = charge(3 << 20, &[("n2", 3 << 20)], false);
        assert!(check(7, &limits, &usage, &b).is_ok());
        usage.add(&b);
        let e = check(
            7,
            &limits,
            &usage,
            &charge(4 << 20, &[("n3", 4 << 20)], false),
        )
        .unwrap_err();
        assert_eq!(e.what, "bytes");
        usage.add(&charge(1, &[("n3", 1)], false));
        let e = check(7, &limits, &usage, &charge(1, &[("n3", 1)], false)).unwrap_err();
        assert_eq!(e.what, "allocations");
        assert_eq!(usage.node_bytes(), 4 << 20);
        // Freeing gives it all back.
        usage.sub(&a);
        usage.sub(&b);
        usage.sub(&charge(1, &[("n3", 1)], false));
        assert!(usage.is_empty() && usage.nodes.is_empty(), "{usage:?}");
    }

    #[test]
    fn a_users_own_quota_replaces_the_default() {
        let mut q = Quotas::default();
        let small = Limits {
            allocations: Some(1),
            ..Limits::NONE
        };
        q.set(Subject::Default, Some(small));
        assert_eq!(q.of(5).allocations, Some(1));
        q.set(Subject::User(5), Some(Limits::NONE));
        assert_eq!(q.of(5).allocations, None);
        assert_eq!(q.of(6).allocations, Some(1));
        q.set(Subject::User(5), None);
        assert_eq!(q.of(5).allocations, Some(1));
        q.set(Subject::Default, None);
        assert_eq!(*q.of(6), Limits::NONE);
    }
}
