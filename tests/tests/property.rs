//! Random (offset, length) copies in and out of a multi-extent allocation,
//! checked byte for byte against a local model.

#![allow(clippy::unwrap_used)]

mod support;

use liboncilla::{AllocSpec, Kind};
use proptest::prelude::*;
use support::Cluster;

const SIZE: u64 = (1 << 20) + 12_345;

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, len: usize, seed: u8 },
    Read { offset: u64, len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let range =
        (0..SIZE).prop_flat_map(|off| (Just(off), 0..=((SIZE - off).min(300_000) as usize)));
    prop_oneof![
        (range.clone(), any::<u8>()).prop_map(|((offset, len), seed)| Op::Write {
            offset,
            len,
            seed
        }),
        range.prop_map(|(offset, len)| Op::Read { offset, len }),
    ]
}

#[test]
fn random_ranges_match_a_local_model() {
    let c = Cluster::start(3, "8MiB");
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(SIZE, Kind::RemoteHost).on_nodes(["node-0", "node-1", "node-2"]),
        )
        .unwrap();
    assert_eq!(a.descriptor().extents.len(), 3);
    // Allocation and model are updated together, so they stay in step across
    // cases and while proptest shrinks.
    let model = std::cell::RefCell::new(vec![0u8; SIZE as usize]);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = prop::collection::vec(op(), 1..12);
    runner
        .run(&strategy, |ops| {
            for op in ops {
                match op {
                    Op::Write { offset, len, seed } => {
                        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
                        a.copy_in(offset, &data).unwrap();
                        model.borrow_mut()[offset as usize..offset as usize + len]
                            .copy_from_slice(&data);
                    }
                    Op::Read { offset, len } => {
                        let mut got = vec![0u8; len];
                        a.copy_out(offset, &mut got).unwrap();
                        let model = model.borrow();
                        prop_assert!(
                            got[..] == model[offset as usize..offset as usize + len],
                            "mismatch at {offset}+{len}"
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // Finally the whole allocation at once.
    let mut all = vec![0u8; SIZE as usize];
    a.copy_out(0, &mut all).unwrap();
    assert!(all == *model.borrow());
}
