//! The completion statuses `wc` names are libibverbs' own numbers (only
//! with the `verbs` feature, which brings the bindings). An integration
//! test, not a unit test, so that deploy/softroce/verbs-tests.sh builds it
//! in the one verbs build it makes for the guest (a unit test needs a
//! build of this crate alone, which resolves its dependencies anew).
#![cfg(feature = "verbs")]

use ibverbs_sys::ibv_wc_status as s;
use oncilla_rdma::wc::{
    failure, REM_ACCESS_ERR, RESP_TIMEOUT_ERR, RETRY_EXC_ERR, SUCCESS, WR_FLUSH_ERR,
};

#[test]
fn numbers_match_the_verbs_bindings() {
    assert_eq!(SUCCESS, s::IBV_WC_SUCCESS);
    assert_eq!(WR_FLUSH_ERR, s::IBV_WC_WR_FLUSH_ERR);
    assert_eq!(REM_ACCESS_ERR, s::IBV_WC_REM_ACCESS_ERR);
    assert_eq!(RETRY_EXC_ERR, s::IBV_WC_RETRY_EXC_ERR);
    assert_eq!(RESP_TIMEOUT_ERR, s::IBV_WC_RESP_TIMEOUT_ERR);
    assert_eq!(
        failure(s::IBV_WC_REM_ACCESS_ERR).unwrap().name,
        "REM_ACCESS_ERR"
    );
    assert_eq!(
        failure(s::IBV_WC_RETRY_EXC_ERR).unwrap().name,
        "RETRY_EXC_ERR"
    );
    assert_eq!(failure(s::IBV_WC_GENERAL_ERR).unwrap().name, "GENERAL_ERR");
}
