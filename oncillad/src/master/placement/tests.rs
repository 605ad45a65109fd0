//! Placement against fixed candidate sets: policies, named nodes, stripes, GPUs.

use super::*;
use oncilla_model::alloc::NodeShare;

const P: u64 = oncilla_model::PAGE;

fn node(name: &str, pages: u64, up: bool) -> Candidate {
    Candidate {
        name: name.into(),
        free: pages * P,
        up,
        draining: false,
        page: P,
        gpus: Vec::new(),
        gpu_note: "no CUDA driver on this node".into(),
        zone: String::new(),
    }
}

fn nodes() -> Vec<Candidate> {
    vec![
        node("a", 100, true),
        node("b", 50, true),
        node("c", 10, true),
        node("d", 999, false),
    ]
}

fn policy(p: Policy) -> Placement {
    Placement {
        policy: p,
        ..Placement::default()
    }
}

fn named_nodes(list: &[(&str, u32)], stripe: u64) -> Placement {
    Placement {
        replicas: 0,
        policy: Policy::LocalFirst,
        nodes: list
            .iter()
            .map(|(n, w)| NodeShare {
                node: n.to_string(),
                weight: *w,
            })
            .collect(),
        stripe,
        gpu: None,
    }
}

fn plan_for(size: u64, kind: Kind, p: &Placement, origin: &str) -> Result<Vec<Planned>, CoreError> {
    plan(
        &Request {
            size,
            kind,
            placement: p,
            origin,
        },
        &nodes(),
    )
}

fn layout_of(plan: &[Planned]) -> Vec<(&str, Vec<(u64, u64)>)> {
    plan.iter()
        .map(|p| (p.node.as_str(), p.ranges.clone()))
        .collect()
}

#[test]
fn local_goes_to_origin_only() {
    let none = Placement::default();
    let p = plan_for(10, Kind::LocalHost, &none, "c").unwrap();
    assert_eq!(layout_of(&p), [("c", vec![(0, 10)])]);
    assert!(plan_for(11 * P, Kind::LocalHost, &none, "c").is_err());
    assert!(plan_for(10, Kind::LocalHost, &none, "").is_err());
    assert!(plan_for(10, Kind::LocalHost, &policy(Policy::Spread), "c").is_err());
}

#[test]
fn local_first_prefers_origin_then_emptiest_then_fills() {
    let lf = policy(Policy::LocalFirst);
    let p = plan_for(5 * P, Kind::RemoteHost, &lf, "c").unwrap();
    assert_eq!(layout_of(&p), [("c", vec![(0, 5 * P)])]);
    // Too big for c: the emptiest node that holds it all.
    let p = plan_for(20 * P, Kind::RemoteHost, &lf, "c").unwrap();
    assert_eq!(layout_of(&p), [("a", vec![(0, 20 * P)])]);
    // Too big for any one node: c first, then emptiest.
    let p = plan_for(120 * P, Kind::RemoteHost, &lf, "c").unwrap();
    assert_eq!(
        layout_of(&p),
        [
            ("c", vec![(0, 10 * P)]),
            ("a", vec![(10 * P, 100 * P)]),
            ("b", vec![(110 * P, 10 * P)])
        ]
    );
    // The default policy is local-first; operators have no origin.
    let p = plan_for(P, Kind::RemoteHost, &Placement::default(), "").unwrap();
    assert_eq!(p[0].node, "a");
}

#[test]
fn pack_uses_the_tightest_fit_then_fewest_nodes() {
    let pk = policy(Policy::Pack);
    let p = plan_for(8 * P, Kind::RemoteHost, &pk, "").unwrap();
    assert_eq!(layout_of(&p), [("c", vec![(0, 8 * P)])]);
    let p = plan_for(40 * P, Kind::RemoteHost, &pk, "").unwrap();
    assert_eq!(p[0].node, "b");
    let p = plan_for(140 * P, Kind::RemoteHost, &pk, "").unwrap();
    assert_eq!(
        layout_of(&p),
        [("a", vec![(0, 100 * P)]), ("b", vec![(100 * P, 40 * P)])]
    );
}

#[test]
fn spread_takes_every_node_with_room_for_a_share() {
    let sp = policy(Policy::Spread);
    let p = plan_for(30 * P, Kind::RemoteHost, &sp, "").unwrap();
    assert_eq!(
        layout_of(&p),
        [
            ("a", vec![(0, 10 * P)]),
            ("b", vec![(10 * P, 10 * P)]),
            ("c", vec![(20 * P, 10 * P)])
        ]
    );
    // c cannot hold a third of 60 pages: a and b split it.
    let p = plan_for(60 * P, Kind::RemoteHost, &sp, "").unwrap();
    assert_eq!(
        p.iter().map(|x| x.node.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // Striped: chunks dealt in turn.
    let striped = Placement {
        stripe: P,
        ..policy(Policy::Spread)
    };
    let p = plan_for(7 * P, Kind::RemoteHost, &striped, "").unwrap();
    assert_eq!(
        layout_of(&p),
        [
            ("a", vec![(0, P), (3 * P, P), (6 * P, P)]),
            ("b", vec![(P, P), (4 * P, P)]),
            ("c", vec![(2 * P, P), (5 * P, P)]),
        ]
    );
}

#[test]
fn named_nodes_split_by_weight_with_optional_stripes() {
    let p = plan_for(
        10,
        Kind::RemoteHost,
        &named_nodes(&[("a", 1), ("b", 1), ("c", 1)], 0),
        "",
    )
    .unwrap();
    // Shares round to base pages; the last takes the rest.
    assert_eq!(layout_of(&p), [("c", vec![(0, 10)])]);
    let p = plan_for(
        12 * P,
        Kind::RemoteHost,
        &named_nodes(&[("a", 3), ("b", 1)], 0),
        "",
    )
    .unwrap();
    assert_eq!(
        layout_of(&p),
        [("a", vec![(0, 9 * P)]), ("b", vec![(9 * P, 3 * P)])]
    );
    let p = plan_for(
        5 * P + 1,
        Kind::RemoteHost,
        &named_nodes(&[("a", 2), ("b", 1)], P),
        "",
    )
    .unwrap();
    assert_eq!(
        layout_of(&p),
        [
            ("a", vec![(0, P), (P, P), (3 * P, P), (4 * P, P)]),
            ("b", vec![(2 * P, P), (5 * P, 1)])
        ]
    );
    // c cannot hold a third of 60 pages.
    let err = plan_for(
        60 * P,
        Kind::RemoteHost,
        &named_nodes(&[("a", 1), ("b", 1), ("c", 1)], 0),
        "",
    )
    .unwrap_err();
    assert!(err.to_string().contains("c 40.0 KiB"), "{err}");
}

#[test]
fn bad_requests_say_why() {
    let msg = plan_for(1, Kind::RemoteHost, &named_nodes(&[("zz", 1)], 0), "")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("unknown node \"zz\"") && msg.contains("a, b, c, d"),
        "{msg}"
    );
    assert!(matches!(
        plan_for(1, Kind::RemoteHost, &named_nodes(&[("d", 1)], 0), ""),
        Err(CoreError::NodeDown(_))
    ));
    assert!(plan_for(
        1,
        Kind::RemoteHost,
        &named_nodes(&[("a", 1), ("a", 2)], 0),
        ""
    )
    .is_err());
    assert!(plan_for(0, Kind::RemoteHost, &Placement::default(), "").is_err());
    let odd = Placement {
        stripe: 1000,
        ..policy(Policy::Spread)
    };
    assert!(plan_for(P, Kind::RemoteHost, &odd, "")
        .unwrap_err()
        .to_string()
        .contains("multiple"));
    let packed = Placement {
        stripe: P,
        ..policy(Policy::Pack)
    };
    assert!(plan_for(P, Kind::RemoteHost, &packed, "").is_err());
    let tiny = Placement {
        stripe: P,
        ..policy(Policy::Spread)
    };
    let msg = plan_for(1 << 40, Kind::RemoteHost, &tiny, "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("use a unit of at least"), "{msg}");
}

#[test]
fn every_policy_reports_exhaustion_with_free_space() {
    for p in [
        policy(Policy::LocalFirst),
        policy(Policy::Pack),
        policy(Policy::Spread),
    ] {
        let err = plan_for(500 * P, Kind::RemoteHost, &p, "a").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("not enough capacity"), "{msg}");
        assert!(
            msg.contains("a 400.0 KiB") && msg.contains("d 3.9 MiB (down)"),
            "{msg}"
        );
    }
}

const G: u64 = 1 << 30;

/// `a` has no GPU, `b` two (8 and 2 GiB free), `c` one (4 GiB), `d`
/// one but is down.
fn gpu_nodes() -> Vec<Candidate> {
    let with = |name: &str, up: bool, gpus: &[u64]| Candidate {
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, f)| GpuRoom {
                index: i as u32,
                free: f * G,
            })
            .collect(),
        gpu_note: String::new(),
        zone: String::new(),
        ..node(name, 100, up)
    };
    vec![
        node("a", 100, true),
        with("b", true, &[8, 2]),
        with("c", true, &[4]),
        with("d", false, &[64]),
    ]
}

fn gpu_plan(size: u64, kind: Kind, p: &Placement, origin: &str) -> Result<Planned, CoreError> {
    let mut plan = plan(
        &Request {
            size,
            kind,
            placement: p,
            origin,
        },
        &gpu_nodes(),
    )?;
    assert_eq!(plan.len(), 1, "a GPU allocation is one device");
    Ok(plan.remove(0))
}

fn at(p: &Planned) -> (&str, Option<u32>) {
    (p.node.as_str(), p.gpu)
}

#[test]
fn local_gpu_goes_on_a_device_of_the_origin() {
    let any = Placement::default();
    let p = gpu_plan(G, Kind::LocalGpu, &any, "b").unwrap();
    assert_eq!(at(&p), ("b", Some(0)), "the device with the most room");
    assert_eq!(p.ranges, vec![(0, G)]);
    let dev1 = Placement {
        gpu: Some(1),
        ..any.clone()
    };
    assert_eq!(
        at(&gpu_plan(G, Kind::LocalGpu, &dev1, "b").unwrap()),
        ("b", Some(1))
    );
    let msg = gpu_plan(3 * G, Kind::LocalGpu, &dev1, "b")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("b GPU 1 2.0 GiB"), "{msg}");
    let msg = gpu_plan(G, Kind::LocalGpu, &any, "a")
        .unwrap_err()
        .to_string();
    assert_eq!(msg, "no GPU: node a: no CUDA driver on this node");
    let dev7 = Placement {
        gpu: Some(7),
        ..any.clone()
    };
    assert!(gpu_plan(G, Kind::LocalGpu, &dev7, "b")
        .unwrap_err()
        .to_string()
        .contains("no GPU 7"));
    assert!(
        gpu_plan(G, Kind::LocalGpu, &any, "").is_err(),
        "needs a session"
    );
    assert!(gpu_plan(G, Kind::LocalGpu, &named_nodes(&[("c", 1)], 0), "b").is_err());
}

#[test]
fn remote_gpu_by_policy_and_by_name() {
    let any = Placement::default();
    // Local first: the origin's GPU when it has room, else the most room.
    assert_eq!(
        at(&gpu_plan(G, Kind::RemoteGpu, &any, "c").unwrap()),
        ("c", Some(0))
    );
    assert_eq!(
        at(&gpu_plan(5 * G, Kind::RemoteGpu, &any, "c").unwrap()),
        ("b", Some(0))
    );
    assert_eq!(
        at(&gpu_plan(G, Kind::RemoteGpu, &any, "a").unwrap()),
        ("b", Some(0))
    );
    // Pack: the tightest device that holds it.
    let pack = policy(Policy::Pack);
    assert_eq!(
        at(&gpu_plan(G, Kind::RemoteGpu, &pack, "").unwrap()),
        ("b", Some(1))
    );
    assert_eq!(
        at(&gpu_plan(3 * G, Kind::RemoteGpu, &pack, "").unwrap()),
        ("c", Some(0))
    );
    // Named node and device.
    let named = Placement {
        gpu: Some(1),
        ..named_nodes(&[("b", 1)], 0)
    };
    assert_eq!(
        at(&gpu_plan(G, Kind::RemoteGpu, &named, "").unwrap()),
        ("b", Some(1))
    );
    // A down node's GPU is never used.
    let msg = gpu_plan(32 * G, Kind::RemoteGpu, &any, "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("d GPU 0 64.0 GiB (down)"), "{msg}");
    assert!(matches!(
        gpu_plan(G, Kind::RemoteGpu, &named_nodes(&[("d", 1)], 0), ""),
        Err(CoreError::NodeDown(_))
    ));
}

#[test]
fn gpu_requests_that_cannot_work_say_why() {
    let spread = policy(Policy::Spread);
    assert!(gpu_plan(G, Kind::RemoteGpu, &spread, "")
        .unwrap_err()
        .to_string()
        .contains("one device"));
    let two = named_nodes(&[("b", 1), ("c", 1)], 0);
    assert!(gpu_plan(G, Kind::RemoteGpu, &two, "")
        .unwrap_err()
        .to_string()
        .contains("name one node"));
    let index_only = Placement {
        gpu: Some(0),
        ..Placement::default()
    };
    assert!(gpu_plan(G, Kind::RemoteGpu, &index_only, "")
        .unwrap_err()
        .to_string()
        .contains("needs a node"));
    // No GPU anywhere: every node's reason.
    let msg = plan_for(G, Kind::RemoteGpu, &Placement::default(), "a")
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("no GPU: no node that is up has one"),
        "{msg}"
    );
    assert!(msg.contains("a: no CUDA driver on this node"), "{msg}");
}
