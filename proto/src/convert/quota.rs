//! Quotas on the wire: limits, what users hold, and a request to set them.

use oncilla_model::quota::{Limits, Report, Subject, Summary, UserReport};

use super::WireError;
use crate::pb;

impl From<Limits> for pb::QuotaLimits {
    fn from(l: Limits) -> Self {
        Self {
            bytes: l.bytes,
            node_bytes: l.node_bytes,
            allocations: l.allocations,
            persistent: l.persistent,
        }
    }
}

impl From<pb::QuotaLimits> for Limits {
    fn from(l: pb::QuotaLimits) -> Self {
        Self {
            bytes: l.bytes,
            node_bytes: l.node_bytes,
            allocations: l.allocations,
            persistent: l.persistent,
        }
    }
}

impl From<Summary> for pb::QuotaUsage {
    fn from(u: Summary) -> Self {
        Self {
            bytes: u.bytes,
            node_bytes: u.node_bytes,
            allocations: u.allocations,
            persistent: u.persistent,
        }
    }
}

impl From<pb::QuotaUsage> for Summary {
    fn from(u: pb::QuotaUsage) -> Self {
        Self {
            bytes: u.bytes,
            node_bytes: u.node_bytes,
            allocations: u.allocations,
            persistent: u.persistent,
        }
    }
}

impl From<Report> for pb::QuotaList {
    fn from(r: Report) -> Self {
        Self {
            default_limits: Some(r.default.into()),
            users: r
                .users
                .into_iter()
                .map(|u| pb::UserQuota {
                    uid: u.uid,
                    limits: u.limits.map(Into::into),
                    usage: Some(u.usage.into()),
                })
                .collect(),
            persistent: r.persistent,
        }
    }
}

impl From<pb::QuotaList> for Report {
    fn from(r: pb::QuotaList) -> Self {
        Self {
            default: r.default_limits.map(Limits::from).unwrap_or_default(),
            users: r
                .users
                .into_iter()
                .map(|u| UserReport {
                    uid: u.uid,
                    limits: u.limits.map(Into::into),
                    usage: u.usage.map(Summary::from).unwrap_or_default(),
                })
                .collect(),
            persistent: r.persistent,
        }
    }
}

/// Whose limits a [`pb::SetQuotaRequest`] sets, and to what (`None`: the
/// user's own are dropped).
///
/// # Errors
/// [`WireError::Missing`] for limits neither given nor cleared; clearing
/// the default (set it to no limits instead).
pub fn quota_setting(r: pb::SetQuotaRequest) -> Result<(Subject, Option<Limits>), WireError> {
    let who = if r.is_default {
        Subject::Default
    } else {
        Subject::User(r.uid)
    };
    match (who, r.clear, r.limits) {
        (Subject::Default, true, _) => Err(WireError::Missing(
            "limits (the default cannot be cleared; set it without limits)",
        )),
        (_, true, _) => Ok((who, None)),
        (_, false, Some(l)) => Ok((who, Some(l.into()))),
        (_, false, None) => Err(WireError::Missing("limits")),
    }
}

/// The wire request that sets `who`'s limits (`None`: clears a user's own).
pub fn quota_request(who: Subject, limits: Option<Limits>) -> pb::SetQuotaRequest {
    let (is_default, uid) = match who {
        Subject::Default => (true, 0),
        Subject::User(uid) => (false, uid),
    };
    pb::SetQuotaRequest {
        is_default,
        uid,
        clear: limits.is_none(),
        limits: limits.map(Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_reports_round_trip() {
        let l = Limits {
            bytes: Some(1 << 30),
            node_bytes: None,
            allocations: Some(7),
            persistent: Some(0),
        };
        for (who, limits) in [
            (Subject::Default, Some(l)),
            (Subject::User(1000), Some(l)),
            (Subject::User(1000), None),
            (Subject::Default, Some(Limits::NONE)),
        ] {
            assert_eq!(quota_setting(quota_request(who, limits)), Ok((who, limits)));
        }
        assert!(quota_setting(quota_request(Subject::Default, None)).is_err());
        let report = Report {
            default: l,
            users: vec![UserReport {
                uid: 3,
                limits: None,
                usage: Summary {
                    bytes: 5,
                    node_bytes: 4,
                    allocations: 2,
                    persistent: 1,
                },
            }],
            persistent: true,
        };
        assert_eq!(Report::from(pb::QuotaList::from(report.clone())), report);
    }
}
