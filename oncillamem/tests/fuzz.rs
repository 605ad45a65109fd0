//! Fuzzing (proptest, a bounded number of cases) of the original API's
//! argument checks, in a process that never calls `ocm_init`: every
//! integer a C caller may pass for a kind or an op flag, every size,
//! offset and handle. No call panics or misbehaves; an out-of-range kind is
//! -1 (invalid), and everything else gets as far as the missing session (-3,
//! not initialized). `tests/c/oncillamem.c` checks bad input against a real
//! cluster.

#![allow(clippy::unwrap_used)]

use std::ffi::c_int;

use oncillamem::*;
use proptest::prelude::*;

const INVALID: c_int = -1;
const NOT_INITIALIZED: c_int = -3;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn alloc_checks_its_kind(local in any::<u64>(), remote in any::<u64>(), kind in prop_oneof![3 => -2..10, 1 => any::<c_int>()]) {
        let mut p = ocm_alloc_params { local_alloc_bytes: local, rem_alloc_bytes: remote, kind };
        // SAFETY: the parameter block is a live, aligned local.
        let a = unsafe { ocm_alloc(&mut p) };
        prop_assert!(a.is_null());
        let expect = if (1..=7).contains(&kind) { NOT_INITIALIZED } else { INVALID };
        prop_assert_eq!(oncillamem_last_error(), expect);
    }

    #[test]
    fn every_call_on_any_handle_fails_cleanly(h in any::<usize>(), off in any::<u64>(), bytes in any::<u64>(), flag in any::<c_int>()) {
        let h = h as ocm_alloc_t;
        let mut p = ocm_params { src_offset: off, dest_offset: off, src_offset_2: off, dest_offset_2: off, bytes, op_flag: flag };
        prop_assert_eq!(ocm_free(h), NOT_INITIALIZED);
        // SAFETY: every pointer is a live, aligned local; the handle is checked first.
        let s = unsafe { ocm_copy(h, h, &mut p) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        // SAFETY: every pointer is a live, aligned local; the handle is checked first.
        let s = unsafe { ocm_copy_onesided(h, &mut p) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        let mut buf = [0u8; 16];
        // SAFETY: a stale or forged handle fails before `buf` (16 live bytes) is touched.
        let s = unsafe { ocm_copy_out(buf.as_mut_ptr().cast(), h) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        // SAFETY: a stale or forged handle fails before `buf` (16 live bytes) is touched.
        let s = unsafe { ocm_copy_in(h, buf.as_mut_ptr().cast()) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        let mut len = 0usize;
        let mut at = std::ptr::null_mut();
        // SAFETY: a stale or forged handle fails before `buf` (16 live bytes) is touched.
        let s = unsafe { ocm_localbuf(h, &mut at, &mut len) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        // SAFETY: every pointer is a live, aligned local; the handle is checked first.
        let s = unsafe { ocm_remote_sz(h, &mut len) };
        prop_assert_eq!(s, NOT_INITIALIZED);
        prop_assert!(!ocm_is_remote(h));
        prop_assert_eq!(ocm_alloc_kind(h), ocm_kind::OCM_KIND_INVALID);
        prop_assert!(!oncillamem_strerror(flag).is_null());
        prop_assert!(!oncillamem_last_error_message().is_null());
    }
}

#[test]
fn null_and_misaligned_parameter_blocks_are_invalid() {
    // SAFETY: NULL is refused before any read.
    assert!(unsafe { ocm_alloc(std::ptr::null_mut()) }.is_null());
    assert_eq!(oncillamem_last_error(), INVALID);
    let mut raw = [0u64; 4];
    // SAFETY: one byte into an array of 32 bytes stays inside it.
    let off = unsafe { raw.as_mut_ptr().cast::<u8>().add(1) }.cast::<ocm_alloc_params>();
    // SAFETY: misaligned pointers are refused before any read.
    assert!(unsafe { ocm_alloc(off) }.is_null());
    assert_eq!(oncillamem_last_error(), INVALID);
    // SAFETY: one byte into an array of 32 bytes stays inside it.
    let off = unsafe { raw.as_mut_ptr().cast::<u8>().add(1) }.cast::<ocm_params>();
    // SAFETY: misaligned pointers are refused before any read.
    let s = unsafe { ocm_copy_onesided(17 as ocm_alloc_t, off) };
    assert_eq!(s, INVALID);
}
