//! Hostile input to the C ABI (`liboncilla.so`, `oncilla.h`) from a
//! process on a real loopback cluster: out-of-range C enums and flags,
//! NULL and misaligned pointers, `ocm_params_t` sizes no struct has and
//! fields a newer program sets, forged handles. The attack runs in a child
//! process, checks each specific, harmless refusal, then allocates,
//! copies and frees there; the cluster still serves afterwards.

#![allow(clippy::unwrap_used)]

mod support;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::process::Command;

use oncilla as capi;
use oncilla::{ocm_params_t, ocm_status_t};
use proptest::prelude::*;
use support::Cluster;

/// Set in the child process that [`c_abi_refuses_out_of_range_values`]
/// runs (the C ABI reads its socket from the environment, which a test
/// must not change in a process whose other tests start clusters).
const ABI_CHILD: &str = "ONCILLA_TEST_ABI_CHILD";

fn last() -> (c_int, String) {
    let msg = capi::ocm_last_error_message();
    // SAFETY: liboncilla returns a NUL-terminated string valid until this
    // thread's next call into it.
    let msg = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    (capi::ocm_last_error(), msg)
}

/// Asserts the last call failed with `OCM_E_INVALID` and a message that
/// contains `needle`.
#[track_caller]
fn assert_invalid(what: &str, needle: &str) {
    let (code, msg) = last();
    assert_eq!(
        code,
        ocm_status_t::OCM_E_INVALID as c_int,
        "{what}: code {code}, message {msg:?}"
    );
    assert!(
        msg.contains(needle),
        "{what}: message {msg:?} lacks {needle:?}"
    );
}

/// `ocm_alloc(4096, 5)` once killed the calling process with SIGILL (a C
/// enum arrived as a Rust enum). Every out-of-range kind, policy, fabric
/// and flag, NULL and misaligned pointer is now `OCM_E_INVALID`, and the
/// same process then allocates, copies and frees normally.
#[test]
fn c_abi_refuses_out_of_range_values() {
    let c = Cluster::start(2, "32MiB");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["abi_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ABI_CHILD, "1")
        .env("ONCILLA_SOCKET", c.socket(0))
        .env("ONCILLA_TOKEN_FILE", c.token_file())
        .env_remove("ONCILLA_TOKEN")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the ABI child failed ({}):\n{text}",
        out.status
    );
    assert!(
        text.contains("abi child: every bad value refused, then served"),
        "{text}"
    );
    c.still_serves();
}

/// The body of [`c_abi_refuses_out_of_range_values`], in its own process;
/// does nothing when run any other way.
#[test]
fn abi_child() {
    if std::env::var_os(ABI_CHILD).is_none() {
        return;
    }
    assert_eq!(capi::ocm_init(), 0, "{:?}", last());

    // Kinds out of range, as a C caller may pass them.
    for kind in [5, 0, -1, 99, c_int::MAX, c_int::MIN] {
        assert!(capi::ocm_alloc(4096, kind).is_null());
        assert_invalid(
            "ocm_alloc with a bad kind",
            &format!("kind {kind} is not a kind"),
        );
    }

    // Every field of ocm_params_t that C may fill with anything.
    let good = capi::ocm_params_default(4096, 2);
    let cases: [(&str, ocm_params_t, &str); 6] = [
        (
            "kind",
            ocm_params_t { kind: 5, ..good },
            "kind 5 is not a kind",
        ),
        (
            "policy",
            ocm_params_t { policy: 99, ..good },
            "policy 99 is not a policy",
        ),
        (
            "fabric",
            ocm_params_t { fabric: 77, ..good },
            "fabric 77 is not a fabric",
        ),
        (
            "persistent",
            ocm_params_t {
                persistent: 2,
                ..good
            },
            "persistent is 2, not 0 or 1",
        ),
        (
            "n_nodes",
            ocm_params_t {
                n_nodes: 1 << 40,
                ..good
            },
            "n_nodes 1099511627776 is more than 65536",
        ),
        (
            "NULL nodes",
            ocm_params_t { n_nodes: 1, ..good },
            "nodes is NULL",
        ),
    ];
    for (what, p, needle) in cases {
        // SAFETY: `p` is a valid ocm_params_t with no pointers to read
        // (only the count is bad: the call refuses before reading).
        assert!(unsafe { capi::ocm_alloc_ex(&p) }.is_null());
        assert_invalid(what, needle);
    }
    // SAFETY: NULL is refused before any read.
    assert!(unsafe { capi::ocm_alloc_ex(std::ptr::null()) }.is_null());
    assert_invalid("NULL params", "params is NULL");

    // Misaligned pointers: params, nodes and weights one byte off.
    let mut bytes = vec![0u64; 2 * std::mem::size_of::<ocm_params_t>() / 8 + 2];
    let off = bytes.as_mut_ptr().cast::<u8>().wrapping_add(1);
    // SAFETY: refused for its alignment before any read.
    assert!(unsafe { capi::ocm_alloc_ex(off.cast::<ocm_params_t>()) }.is_null());
    assert_invalid("misaligned params", "params");
    assert_invalid("misaligned params", "is not aligned");
    let node = c"node-1";
    let nodes = [node.as_ptr(), node.as_ptr()];
    let weights = [1u32, 1, 1];
    let misaligned_nodes = ocm_params_t {
        n_nodes: 1,
        nodes: nodes.as_ptr().cast::<u8>().wrapping_add(1).cast(),
        ..good
    };
    // SAFETY: refused for its alignment before any read through `nodes`.
    assert!(unsafe { capi::ocm_alloc_ex(&misaligned_nodes) }.is_null());

    assert_invalid("misaligned nodes", "nodes (");
    // struct_size: a struct made by hand (0), one smaller than this
    // version's, a size no struct has, and a newer program's struct
    // asking for a field this library does not know.
    let known = std::mem::size_of::<ocm_params_t>();
    for (size, needle) in [
        (0, "start from ocm_params_default()"),
        (known - 8, "less than this library's ocm_params_t"),
        (1 << 20, "is no ocm_params_t"),
    ] {
        let p = ocm_params_t {
            struct_size: size,
            ..good
        };
        // SAFETY: refused on `struct_size` before reading past the struct.
        assert!(unsafe { capi::ocm_alloc_ex(&p) }.is_null());
        assert_invalid("struct_size", needle);
    }
    // ocm_params_init writes only sizes it can take: a megabyte is refused
    // before any byte is written.
    let mut target = good;
    // SAFETY: refused on its size before writing.
    let status = unsafe { capi::ocm_params_init(&mut target, 1 << 20, 4096, 1) };
    assert_eq!(status, ocm_status_t::OCM_E_INVALID as c_int);
    assert_invalid("ocm_params_init of a megabyte", "is no ocm_params_t");
    // A newer program's struct: this version's fields, then 16 bytes more.
    let mut newer = vec![0u64; known / 8 + 2];
    let with = |tail: u64, newer: &mut Vec<u64>| {
        let p = ocm_params_t {
            struct_size: known + 16,
            ..capi::ocm_params_default(4096, 1)
        };
        // SAFETY: `newer` holds `known + 16` bytes, aligned for u64 (the
        // struct's alignment), and `p` fits at its start.
        unsafe { newer.as_mut_ptr().cast::<ocm_params_t>().write(p) };
        newer[known / 8 + 1] = tail;
        newer.as_ptr().cast::<ocm_params_t>()
    };
    let asks = with(7, &mut newer);
    // SAFETY: `known + 16` readable bytes at `asks`.
    assert!(unsafe { capi::ocm_alloc_ex(asks) }.is_null());
    assert_invalid("a newer field set", "does not know");
    let misaligned_weights = ocm_params_t {
        n_nodes: 1,
        nodes: nodes.as_ptr(),
        weights: weights.as_ptr().cast::<u8>().wrapping_add(1).cast(),
        ..good
    };
    // SAFETY: `nodes` holds one valid string; `weights` is refused for
    // its alignment before any read.
    assert!(unsafe { capi::ocm_alloc_ex(&misaligned_weights) }.is_null());
    assert_invalid("misaligned weights", "weights (");

    // Forged handles (no handle is live yet, so none can collide).
    proptest!(ProptestConfig::with_cases(256), |(h in any::<usize>(), off in any::<u64>(), len in 0u64..1 << 20)| {
        let h = h as capi::ocm_alloc_t;
        prop_assert_eq!(capi::ocm_free(h), ocm_status_t::OCM_E_BAD_HANDLE as c_int);
        prop_assert_eq!(capi::ocm_copy(h, off, h, off, len), ocm_status_t::OCM_E_BAD_HANDLE as c_int);
        let mut buf = [0u8; 16];
        // SAFETY: `buf` is 16 writable bytes; the handle is refused first.
        prop_assert_eq!(unsafe { capi::ocm_copy_out(h, off, buf.as_mut_ptr().cast(), 16) }, ocm_status_t::OCM_E_BAD_HANDLE as c_int);
        prop_assert_eq!(capi::ocm_is_remote(h), -1);
        prop_assert_eq!(capi::ocm_remote_sz(h), 0);
        prop_assert_eq!(capi::ocm_kind(h) as c_int, 0);
        prop_assert!(capi::ocm_localbuf(h).is_null());
    });

    // The same process still works: alloc, copy in, copy across, copy
    // out, free.
    let local = capi::ocm_alloc(1 << 16, 1);
    assert!(!local.is_null(), "{:?}", last());
    let nodes = [c"node-1".as_ptr()];
    let remote_params = ocm_params_t {
        nodes: nodes.as_ptr(),
        n_nodes: 1,
        ..capi::ocm_params_default(1 << 16, 2)
    };
    // SAFETY: `nodes` holds one NUL-terminated string for the call.
    let remote = unsafe { capi::ocm_alloc_ex(&remote_params) };
    assert!(!remote.is_null(), "{:?}", last());
    // A newer program's struct whose new fields are zero: their defaults.
    let zero_tail = with(0, &mut newer);
    // SAFETY: `known + 16` readable bytes at `zero_tail`.
    let fits = unsafe { capi::ocm_alloc_ex(zero_tail) };
    assert!(!fits.is_null(), "{:?}", last());
    assert_eq!(capi::ocm_free(fits), 0);
    // Buffers the header says are checked: NULL with a length, and a
    // length no memory can hold.
    // SAFETY: refused before any read.
    let null_src = unsafe { capi::ocm_copy_in(local, 0, std::ptr::null(), 8) };
    assert_eq!(null_src, 1);
    assert_invalid("NULL src", "src is NULL");
    let byte = 0u8;
    // SAFETY: refused for its length before any read.
    let huge = unsafe { capi::ocm_copy_in(local, 0, (&byte as *const u8).cast(), u64::MAX) };
    assert_eq!(huge, 1);
    assert_invalid("huge len", "does not fit in memory");

    let data: Vec<u8> = (0..1u32 << 16).map(|i| (i % 253) as u8).collect();
    // SAFETY: `data` is 64 KiB of readable bytes.
    let rc = unsafe { capi::ocm_copy_in(local, 0, data.as_ptr().cast::<c_void>(), 1 << 16) };
    assert_eq!(rc, 0, "{:?}", last());
    assert_eq!(
        capi::ocm_copy(remote, 0, local, 0, 1 << 16),
        0,
        "{:?}",
        last()
    );
    let mut back = vec![0u8; 1 << 16];
    // SAFETY: `back` is 64 KiB of writable bytes used by nothing else.
    let rc = unsafe { capi::ocm_copy_out(remote, 0, back.as_mut_ptr().cast::<c_void>(), 1 << 16) };
    assert_eq!(rc, 0, "{:?}", last());
    assert!(back == data, "the bytes came back different");
    assert_eq!(capi::ocm_free(local), 0, "{:?}", last());
    assert_eq!(capi::ocm_free(remote), 0, "{:?}", last());
    assert_eq!(capi::ocm_tini(), 0, "{:?}", last());
    let _: *const c_char = capi::ocm_strerror(c_int::MIN);
    println!("abi child: every bad value refused, then served");
}
