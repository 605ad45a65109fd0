//! A cluster whose nodes sit in separate network namespaces joined by veth
//! pairs (deploy/netns-cluster.sh), so data really crosses a network stack
//! between hosts. Needs root and iproute2; elsewhere it says why it skipped.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

struct NetnsCluster {
    script: PathBuf,
    dir: PathBuf,
    prefix: String,
}

impl NetnsCluster {
    fn cmd(&self, args: &[&str]) -> Output {
        let bin = support::bin("oncillad");
        Command::new("bash")
            .arg(&self.script)
            .args(args)
            .env("ONCILLA_BIN", bin.parent().unwrap())
            .env("ONCILLA_NETNS_DIR", &self.dir)
            .env("ONCILLA_NETNS_PREFIX", &self.prefix)
            .env_remove("ONCILLA_TOKEN")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        let _ = self.cmd(&["down"]);
    }
}

fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not root".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns` unusable: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("no iproute2 (`ip`): {e}")),
    }
}

#[test]
fn three_hosts_in_namespaces() {
    if let Some(why) = skip_reason() {
        println!("skipped netns cluster test: {why}");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let c = NetnsCluster {
        script: root.join("deploy/netns-cluster.sh"),
        dir: std::env::temp_dir().join(format!("oncilla-netns-test-{}", std::process::id())),
        prefix: format!("oct{}", std::process::id() % 10_000),
    };
    c.ok(&["up", "3", "16MiB"]);

    let nodes = c.ok(&["run", "1", "ocmctl", "nodes", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    let addrs: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["data_addr"].as_str().unwrap())
        .collect();
    assert_eq!(addrs.len(), 3);
    assert!(addrs.iter().all(|a| a.starts_with("10.78.0.")), "{addrs:?}");

    // From host 1, put data on hosts 0 and 2 and read it back.
    let id = c.ok(&[
        "run", "1", "ocmctl", "alloc", "3MiB", "--node", "node-0", "--node", "node-2",
    ]);
    let id = id.trim();
    let input = c.dir.join("in.bin");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    c.ok(&["run", "1", "ocmctl", "put", id, input.to_str().unwrap()]);
    let output = c.dir.join("out.bin");
    c.ok(&[
        "run",
        "2",
        "ocmctl",
        "get",
        id,
        "--len",
        "3000000",
        "-o",
        output.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&output).unwrap() == data,
        "bytes differ after crossing namespaces"
    );
    c.ok(&["run", "0", "ocmctl", "free", id]);
}
