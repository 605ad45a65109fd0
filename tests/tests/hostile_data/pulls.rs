//! Third-party copies (pulls) as an attacker shapes them: they reach only
//! the cluster's data ports and only what the client may read.

use super::*;

/// Sends a PULL on `s` (the header, then `record` as its source) and
/// reads the reply: status and message.
fn pull_raw(
    s: &mut TcpStream,
    dst: (u64, [u8; KEY_LEN]),
    offset: u64,
    len: u64,
    record: &[u8],
) -> (Status, String) {
    let req = Request {
        op: Op::Pull,
        alloc_id: dst.0,
        key: dst.1,
        offset,
        len,
    };
    let (status, msg) = support::data_exchange(s, &req, record);
    (status, String::from_utf8_lossy(&msg).into_owned())
}

fn source(id: u64, key: [u8; KEY_LEN], offset: u64, addr: &str) -> Vec<u8> {
    wire::Source {
        alloc_id: id,
        key,
        offset,
        addr: addr.to_string(),
    }
    .encode()
    .unwrap()
}

/// A PULL makes the agent dial out and read for the client (issue 22), so
/// it must reach nothing the client could not: no address but a node's
/// data port (a listener of ours is never dialed), no allocation without
/// its key, no bytes out of bounds; a malformed source record ends only
/// that connection; and the victim's bytes and the cluster stay intact.
#[test]
fn a_pull_reaches_only_cluster_data_ports_and_what_the_client_may_read() {
    let c = Cluster::start(2, "32MiB");
    let (src_id, src_key, src_addr) = raw_allocation(&c, 1 << 20, "node-0");
    let (dst_id, dst_key, dst_addr) = raw_allocation(&c, 1 << 20, "node-1");
    let src_addr = src_addr.to_string();
    let mut s = c.data_client(dst_addr);
    let dst = (dst_id, dst_key);
    // The source's bytes, written as an operator.
    let mut w = c.data_client(src_addr.parse().unwrap());
    let data = pattern(1 << 20, 5);
    w.write_all(
        &Request {
            op: Op::Write,
            alloc_id: src_id,
            key: src_key,
            offset: 0,
            len: 1 << 20,
        }
        .encode(),
    )
    .unwrap();
    w.write_all(&data).unwrap();
    let mut head = [0u8; REPLY_LEN];
    w.read_exact(&mut head).unwrap();
    assert_eq!(Reply::decode(&head).unwrap().status, Status::Ok);

    // A listener that is no node's data port is never dialed.
    let bait = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    bait.set_nonblocking(true).unwrap();
    let bait_addr = bait.local_addr().unwrap().to_string();
    let (status, msg) = pull_raw(
        &mut s,
        dst,
        0,
        4096,
        &source(src_id, src_key, 0, &bait_addr),
    );
    assert_eq!(status, Status::Internal, "{msg}");
    assert!(msg.contains("not the data address of any node"), "{msg}");
    assert!(
        matches!(bait.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the agent dialed a stranger's address"
    );
    // Nor the master's gRPC port, nor another name for a node's port.
    let other_name = src_addr.replace("127.0.0.1", "localhost");
    for addr in [c.master_addr.as_str(), other_name.as_str()] {
        let (status, msg) = pull_raw(&mut s, dst, 0, 4096, &source(src_id, src_key, 0, addr));
        assert_eq!(status, Status::Internal, "{addr}: {msg}");
        assert!(msg.contains("not the data address"), "{addr}: {msg}");
    }

    // A wrong source key learns what a wrong key always does, and the
    // destination is untouched.
    let (status, msg) = pull_raw(
        &mut s,
        dst,
        0,
        4096,
        &source(src_id, [0x5a; KEY_LEN], 0, &src_addr),
    );
    assert_eq!(status, Status::NoSuchAllocation, "{msg}");
    assert!(msg.starts_with("pull source: "), "{msg}");
    // Source bytes out of bounds, and destination bytes out of bounds.
    let (status, msg) = pull_raw(
        &mut s,
        dst,
        0,
        8192,
        &source(src_id, src_key, (1 << 20) - 4096, &src_addr),
    );
    assert_eq!(status, Status::OutOfBounds, "{msg}");
    let (status, msg) = pull_raw(
        &mut s,
        dst,
        (1 << 20) - 4096,
        8192,
        &source(src_id, src_key, 0, &src_addr),
    );
    assert_eq!(status, Status::OutOfBounds, "{msg}");
    // A destination without its key: no dial, the usual refusal.
    let (status, _) = pull_raw(
        &mut s,
        (dst_id, [1; KEY_LEN]),
        0,
        4096,
        &source(src_id, src_key, 0, &src_addr),
    );
    assert_eq!(status, Status::NoSuchAllocation);
    let mut back = [0u8; 8192];
    let mut r = c.data_client(dst_addr);
    let read = |r: &mut TcpStream, back: &mut [u8]| {
        r.write_all(
            &Request {
                op: Op::Read,
                alloc_id: dst_id,
                key: dst_key,
                offset: 0,
                len: back.len() as u64,
            }
            .encode(),
        )
        .unwrap();
        let mut head = [0u8; REPLY_LEN];
        r.read_exact(&mut head).unwrap();
        assert_eq!(Reply::decode(&head).unwrap().status, Status::Ok);
        r.read_exact(back).unwrap();
    };
    read(&mut r, &mut back);
    assert!(back.iter().all(|&b| b == 0), "a refused pull wrote bytes");

    // The same connection, still in step, pulls for real.
    let (status, msg) = pull_raw(
        &mut s,
        dst,
        0,
        8192,
        &source(src_id, src_key, 100, &src_addr),
    );
    assert_eq!((status, msg.as_str()), (Status::Ok, ""));
    read(&mut r, &mut back);
    assert!(back[..] == data[100..8292], "pulled bytes differ");

    // Malformed source records: an empty address, one past 255 bytes, one
    // that is not UTF-8. Each ends its connection with a reply; nothing else.
    let mut bad = source(src_id, src_key, 0, "x");
    bad[32..34].copy_from_slice(&0u16.to_le_bytes());
    let mut long = source(src_id, src_key, 0, "x");
    long[32..34].copy_from_slice(&300u16.to_le_bytes());
    let mut not_utf8 = source(src_id, src_key, 0, "xy");
    not_utf8[34..36].copy_from_slice(&[0xff, 0xfe]);
    for record in [bad, long, not_utf8] {
        let mut t = c.data_client(dst_addr);
        let (status, msg) = pull_raw(&mut t, dst, 0, 4096, &record);
        assert_eq!(status, Status::Internal, "{msg}");
        assert!(msg.contains("bad pull source"), "{msg}");
        assert!(
            Cluster::eventually(Cluster::EVENT, || tcp_closed(&t)),
            "the agent kept a connection out of step"
        );
    }
    read(&mut r, &mut back);
    assert!(back[..] == data[100..8292]);
    normal_copy(&c, "node-1", 1 << 20, 6);
    c.still_serves();
}
