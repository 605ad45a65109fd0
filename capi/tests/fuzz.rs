//! Fuzzing (proptest, a bounded number of cases) of the C ABI's argument
//! checks, in a process that never calls `ocm_init`: every integer a C
//! caller may pass for a kind, policy, fabric or flag, every count and
//! handle. No call panics or misbehaves; an out-of-range value is
//! `OCM_E_INVALID` and an in-range one gets as far as the missing session
//! (`OCM_E_NOT_INITIALIZED`). `tests/tests/hostile_input.rs` does the same
//! against a real cluster.

#![allow(clippy::unwrap_used)]

use std::ffi::c_int;

use oncilla as capi;
use oncilla::{ocm_params_t, ocm_status_t};
use proptest::prelude::*;

const INVALID: c_int = ocm_status_t::OCM_E_INVALID as c_int;
const NOT_INITIALIZED: c_int = ocm_status_t::OCM_E_NOT_INITIALIZED as c_int;

/// Mostly small values (in range and just outside), sometimes anything.
fn int() -> impl Strategy<Value = c_int> {
    prop_oneof![3 => -2..7, 1 => any::<c_int>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn alloc_checks_its_kind(size in any::<u64>(), kind in int()) {
        prop_assert!(capi::ocm_alloc(size, kind).is_null());
        let expect = if (1..=4).contains(&kind) { NOT_INITIALIZED } else { INVALID };
        prop_assert_eq!(capi::ocm_last_error(), expect);
    }

    #[test]
    fn alloc_ex_checks_every_field(
        size in any::<u64>(),
        kind in int(),
        policy in int(),
        fabric in int(),
        persistent in prop_oneof![3 => 0u8..3, 1 => any::<u8>()],
        n_nodes in prop_oneof![3 => Just(0usize), 1 => any::<usize>()],
        stripe in any::<u64>(),
        gpu in any::<i32>(),
    ) {
        let p = ocm_params_t {
            size,
            kind,
            policy,
            fabric,
            persistent,
            n_nodes,
            stripe,
            gpu,
            ..capi::ocm_params_default(0, 0)
        };
        // SAFETY: `p` has no pointers (NULL nodes, weights and name), so
        // nothing is read through one.
        let a = unsafe { capi::ocm_alloc_ex(&p) };
        prop_assert!(a.is_null());
        let valid = (1..=4).contains(&kind)
            && (0..=2).contains(&policy)
            && (0..=3).contains(&fabric)
            && persistent <= 1
            && n_nodes == 0;
        prop_assert_eq!(capi::ocm_last_error(), if valid { NOT_INITIALIZED } else { INVALID });
    }

    #[test]
    fn handles_are_never_dereferenced(h in any::<usize>(), off in any::<u64>(), len in any::<u64>(), code in any::<c_int>()) {
        let h = h as capi::ocm_alloc_t;
        prop_assert_eq!(capi::ocm_free(h), NOT_INITIALIZED);
        prop_assert_eq!(capi::ocm_copy(h, off, h, off, len), NOT_INITIALIZED);
        prop_assert_eq!(capi::ocm_is_remote(h), -1);
        prop_assert_eq!(capi::ocm_remote_sz(h), 0);
        prop_assert_eq!(capi::ocm_kind(h) as c_int, 0);
        prop_assert!(capi::ocm_localbuf(h).is_null());
        prop_assert!(!capi::ocm_strerror(code).is_null());
        prop_assert!(!capi::ocm_last_error_message().is_null());
    }
}
