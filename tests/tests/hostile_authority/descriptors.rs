//! A node's file descriptors under attack: small allocations that would
//! each hold a memory file, and mapping replies left unread with files in
//! flight.

use super::*;

/// Before, one session made about 20,000 allocations of 4 KiB, each
/// holding a memory file (a descriptor) on its node, until the agent hit
/// EMFILE: new applications then failed `ocm_init` and new data
/// connections were closed at once, for as long as the allocations lived.
/// Now only memory a process may map holds a file (persistent allocations,
/// and a session's on its own node: see the next test), the node's memory
/// files stay under a budget (its open-file limit less a quarter kept for
/// connections, checked as the limit is now) and one user's small
/// allocations may hold half of it: the greedy user's persistent ones are
/// refused with a message naming its share, and a new application,
/// another user's small allocations and the operator are all served on
/// that node.
#[test]
fn small_allocations_cannot_use_up_a_nodes_descriptors() {
    let c = Cluster::start(2, "64MiB");
    // The systemd unit's limit is 65,536; a low one makes the attack quick
    // (1,024: 768 for memory files, a user's share 384).
    lower_agent_nofile(&c, 1, 1024);
    let greedy = c.client(0);
    let mut held = Vec::new();
    let mut refusal = None;
    for _ in 0..1024 {
        let spec = AllocSpec::new(4096, Kind::RemoteHost)
            .on_nodes(["node-1"])
            .persistent();
        match greedy.alloc_with(&spec) {
            Ok(a) => held.push(a),
            Err(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    let msg = refusal.expect("the greedy user was never refused");
    assert!(msg.contains("its share (384"), "{msg}");
    assert_eq!(
        held.len(),
        384,
        "small allocations one user holds on node-1"
    );

    // A new application starts and copies on that node.
    let fresh = c.client(0);
    let spec = AllocSpec::new(1 << 20, Kind::RemoteHost).on_nodes(["node-1"]);
    let a = fresh.alloc_with(&spec).unwrap();
    a.copy_in(0, b"fresh").unwrap();
    let mut back = [0u8; 5];
    a.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"fresh");
    a.free().unwrap();
    // The operator's small allocation on it.
    operator_is_served(&c, "node-1", "4KiB");
    // Another user's small allocations there.
    if nix::unistd::geteuid().is_root() {
        open_sockets_to_others(&c, 0);
        run_role_as_other_user(&c, "small-files");
    } else {
        println!("skipped the other user's part: needs root to run a process as another user");
    }
    // The greedy user's files come back when it lets go.
    for a in held {
        a.free().unwrap();
    }
    greedy
        .alloc_with(
            &AllocSpec::new(4096, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .persistent(),
        )
        .unwrap()
        .free()
        .unwrap();
    c.still_serves();
}

/// Asks agent `i`'s map server, as a raw session of that node, for the
/// first extent of `a`; the reply's status and message (empty on a grant).
fn raw_map(c: &Cluster, i: usize, a: &oncilla_model::alloc::Allocation) -> (wire::Status, String) {
    let (_, status, msg) = map_request(c, i, &open_raw_on(c, i), a);
    (status, msg)
}

/// A map connection to agent `i` with `me`'s credential that asked for the
/// first extent of `a`: the connection (a grant's files and the grant
/// itself are left unread in it), the reply's status, and its message
/// (empty on a grant).
fn map_request(
    c: &Cluster,
    i: usize,
    me: &RawSession,
    a: &oncilla_model::alloc::Allocation,
) -> (std::os::unix::net::UnixStream, wire::Status, String) {
    use std::io::Read as _;
    let mut s =
        std::os::unix::net::UnixStream::connect(format!("{}.map", c.socket(i).display())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wire::write_hello(&mut s, me.credential.as_bytes()).unwrap();
    let (welcome, msg) = wire::read_welcome(&mut s).unwrap();
    assert_eq!(welcome, wire::Welcome::Ok, "{msg}");
    let extent = &a.extents[0];
    let req = wire::Request {
        op: wire::Op::Read,
        alloc_id: a.id,
        key: a.access_key.as_slice().try_into().unwrap(),
        offset: extent.alloc_offset,
        len: extent.len,
    };
    s.write_all(&req.encode()).unwrap();
    let mut head = [0u8; wire::REPLY_LEN];
    s.read_exact(&mut head).unwrap();
    let reply = wire::Reply::decode(&head).unwrap();
    if reply.status == wire::Status::Ok {
        return (s, reply.status, String::new());
    }
    let mut msg = vec![0u8; usize::try_from(reply.len).unwrap()];
    s.read_exact(&mut msg).unwrap();
    (s, reply.status, String::from_utf8(msg).unwrap())
}

/// Memory nobody may map (a session's on another node than the session's)
/// holds no memory file: one application's thousand small allocations on
/// another node, more than that node's whole budget of files, are all
/// served and cost it no descriptor, their bytes are where they were put,
/// and that node's own applications still map theirs.
#[test]
fn small_allocations_nobody_maps_hold_no_descriptor() {
    let c = Cluster::start(2, "64MiB");
    // 768 memory files at most on node-1, 384 for one user.
    lower_agent_nofile(&c, 1, 1024);
    let pid = c.agent_pid(1).unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let app = c.client(0);
    let spec = AllocSpec::new(4096, Kind::RemoteHost)
        .on_nodes(["node-1"])
        .fabric(Fabric::Tcp);
    let held: Vec<_> = (0..1000)
        .map(|i| {
            app.alloc_with(&spec)
                .unwrap_or_else(|e| panic!("allocation {i} refused: {e}"))
        })
        .collect();
    let after = fds();
    println!("node-1 descriptors: {before} before 1,000 small allocations, {after} after");
    assert!(
        after < before + 64,
        "1,000 small allocations nobody maps took {} descriptors on node-1",
        after - before
    );
    for (i, a) in held.iter().enumerate().step_by(97) {
        a.copy_in(0, &[i as u8; 4096]).unwrap();
    }
    for (i, a) in held.iter().enumerate().step_by(97) {
        let mut back = [0u8; 4096];
        a.copy_out(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8), "allocation {i}'s bytes");
    }
    // Asked anyway, node-1's map server refuses to hand out their memory
    // (its files back other memory too).
    let record = c
        .master()
        .unwrap()
        .allocation(&oncilla_model::alloc::AllocRef::Id(held[0].id()))
        .unwrap();
    let (status, msg) = raw_map(&c, 1, &record);
    assert_eq!(status, wire::Status::OutOfBounds, "{msg}");
    assert!(
        msg.contains("belongs to a session of another node"),
        "{msg}"
    );
    // A persistent allocation's memory there is handed out.
    let kept = c.persistent_on(4096, "node-1");
    let (status, msg) = raw_map(&c, 1, &kept);
    assert_eq!(status, wire::Status::Ok, "{msg}");
    c.ocmctl_ok(&["free", &kept.id.to_string()]);
    // An application on node-1 maps its own memory there, beside them.
    let local = c.client(1);
    let mine = local.alloc(4096, Kind::LocalHost).unwrap();
    assert_eq!(mine.fabrics(), [Fabric::Shm]);
    mine.copy_in(0, b"mapped").unwrap();
    let mut back = [0u8; 6];
    mine.copy_out(0, &mut back).unwrap();
    assert_eq!(&back, b"mapped");
    mine.free().unwrap();
    for a in held {
        a.free().unwrap();
    }
    c.still_serves();
}

/// Before, 150 map connections each asking for grants of a 64 MiB
/// allocation and reading nothing left every descriptor the agent could
/// have in flight (the kernel bounds them per sending user, by the
/// agent's open-file limit) in sockets nobody read: other applications
/// got "agent closed the map socket" until the attacker closed. Now each
/// grant's files are charged to the user they go to (an eighth of the
/// limit each, half of it in all), and a connection reads no further
/// request until its process took them: the attacker is refused with a
/// message naming its share, another user maps, the operator copies, and
/// once the attacker closes its connections its share is back.
#[test]
fn one_user_cannot_fill_the_descriptors_in_flight() {
    use std::io::Read as _;
    let c = Cluster::start(2, "96MiB");
    // The unit's limit is 65,536; 1,024 makes the attack short (a user's
    // share 128 files in flight).
    lower_agent_nofile(&c, 0, 1024);
    let bait = c.persistent_on(32 << 20, "node-0");
    let me = open_raw(&c);
    let mut held = Vec::new();
    let mut files = 0;
    let mut refusal = None;
    for _ in 0..64 {
        // The reply and grant only: the files ride on later bytes, left
        // unread in the socket.
        let (mut s, status, msg) = map_request(&c, 0, &me, &bait);
        if status != wire::Status::Ok {
            assert_eq!(status, wire::Status::Busy);
            refusal = Some(msg);
            break;
        }
        let mut grant = [0u8; wire::GRANT_LEN];
        s.read_exact(&mut grant).unwrap();
        files = wire::MapGrant::decode(&grant).files;
        held.push(s);
    }
    let msg = refusal.expect("the attacker was never refused");
    assert!(files > 1, "a grant of {files} files");
    let share = 128;
    assert_eq!(held.len() as u64, share / files, "grants left unread");
    assert!(
        msg.contains(&format!(
            "uid 0 has {} memory files in flight",
            held.len() as u64 * files
        )) && msg.contains("share (128)"),
        "{msg}"
    );

    // Another user maps; the operator copies.
    if nix::unistd::geteuid().is_root() {
        open_sockets_to_others(&c, 0);
        run_role_as_other_user(&c, "map");
    } else {
        println!("skipped the other user's part: needs root to run a process as another user");
    }
    operator_is_served(&c, "node-0", "1MiB");

    // Closing the connections drops the unread files: the share is back.
    drop(held);
    let ocm = c.client(0);
    let mut last = String::new();
    let mapped = Cluster::eventually(Cluster::EVENT, || {
        match ocm.alloc(1 << 20, Kind::LocalHost) {
            Ok(mut a) => {
                a.localbuf().unwrap()[..2].copy_from_slice(b"ok");
                a.free().unwrap();
                true
            }
            Err(e) => {
                last = e.to_string();
                false
            }
        }
    });
    assert!(mapped, "the attacker's share never came back: {last}");
    let out = c.ocmctl(&["free", &bait.id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.still_serves();
}
