//! What a work completion's status means, in words an operator can act
//! on. The numbers are `enum ibv_wc_status` of `<infiniband/verbs.h>`
//! (fixed by the verbs ABI; the `verbs` build checks them against the
//! bindings). Pure: no device needed.

/// A completion that did not succeed: the status code and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: u32,
    pub name: &'static str,
    pub meaning: &'static str,
}

pub const SUCCESS: u32 = 0;
pub const WR_FLUSH_ERR: u32 = 5;
/// The remote key or address was refused: not (or no longer) registered.
pub const REM_ACCESS_ERR: u32 = 10;
/// No answer from the remote HCA after every retry.
pub const RETRY_EXC_ERR: u32 = 12;
/// The remote HCA did not answer in time.
pub const RESP_TIMEOUT_ERR: u32 = 20;

/// `None` for success, else what the status means.
pub fn failure(status: u32) -> Option<Failure> {
    let (name, meaning) = match status {
        SUCCESS => return None,
        1 => ("LOC_LEN_ERR", "a local buffer is shorter than the request (bug in chunk planning)"),
        2 => ("LOC_QP_OP_ERR", "the local queue pair rejected the request (bad work request or QP state)"),
        3 => ("LOC_EEC_OP_ERR", "local EE context error"),
        4 => ("LOC_PROT_ERR", "a local buffer is not covered by its memory registration (registration cache out of date?)"),
        WR_FLUSH_ERR => ("WR_FLUSH_ERR", "flushed: an earlier request on this queue pair failed, so the pair is in the error state"),
        6 => ("MW_BIND_ERR", "memory window bind failed"),
        7 => ("BAD_RESP_ERR", "unexpected response from the remote HCA"),
        8 => ("LOC_ACCESS_ERR", "local access violation: a buffer was registered without the access this request needs"),
        9 => ("REM_INV_REQ_ERR", "the remote HCA found the request invalid (length above its limit, or an operation it does not support)"),
        REM_ACCESS_ERR => ("REM_ACCESS_ERR", "remote access refused: the remote address or key is not (or no longer) registered on that agent; it may have restarted"),
        11 => ("REM_OP_ERR", "the remote HCA could not complete the operation"),
        RETRY_EXC_ERR => ("RETRY_EXC_ERR", "no answer from the remote HCA after every retry: the link, the remote host or its agent is down, or the path (LID/GID/MTU) is wrong"),
        13 => ("RNR_RETRY_EXC_ERR", "receiver not ready after every retry"),
        14 => ("LOC_RDD_VIOL_ERR", "local RDD violation"),
        15 => ("REM_INV_RD_REQ_ERR", "remote invalid RD request"),
        16 => ("REM_ABORT_ERR", "the remote side aborted the operation"),
        17 => ("INV_EECN_ERR", "invalid EE context number"),
        18 => ("INV_EEC_STATE_ERR", "invalid EE context state"),
        19 => ("FATAL_ERR", "fatal error in the local HCA; check the device (dmesg) and restart the process"),
        RESP_TIMEOUT_ERR => ("RESP_TIMEOUT_ERR", "the remote HCA did not answer in time"),
        21 => ("GENERAL_ERR", "general error reported by the HCA"),
        22 => ("TM_ERR", "tag matching error"),
        23 => ("TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete"),
        _ => ("UNKNOWN", "status not known to this build of Oncilla"),
    };
    // Any error completion also moves an RC queue pair to the error state
    // (every later request on it is flushed): callers drop the pair.
    Some(Failure {
        status,
        name,
        meaning,
    })
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IBV_WC_{} ({}): {}",
            self.name, self.status, self.meaning
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_a_name_and_advice() {
        assert_eq!(failure(SUCCESS), None);
        for s in 1..=23 {
            let f = failure(s).unwrap();
            assert_ne!(f.name, "UNKNOWN", "status {s}");
            assert!(f.to_string().starts_with("IBV_WC_"));
        }
        let f = failure(10).unwrap();
        assert!(f.to_string().contains("REM_ACCESS_ERR (10)"));
        assert!(f.meaning.contains("restarted"));
        assert_eq!(failure(99).unwrap().name, "UNKNOWN");
    }
}
