//! Prometheus metrics on a real cluster (issue 23): every daemon's
//! endpoint refuses a scraper without the token, serves text that
//! `promtool check metrics` accepts, and moves with what the cluster does;
//! a real Prometheus server scrapes the cluster and answers PromQL for a
//! value the test changed, and every query of the Grafana dashboard
//! (`deploy/grafana/oncilla.json`) is valid there and reads only metrics
//! the daemons serve. Loopback only; every wait bounded. Tests that
//! need promtool or prometheus (Debian's `prometheus`, installed by
//! `.ci/run`) print one line and skip where they are missing.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use liboncilla::{AllocSpec, Fabric, Kind};
use support::{get, sample, Cluster};

const BOUND: Duration = Duration::from_secs(40);

fn token(c: &Cluster) -> String {
    std::fs::read_to_string(c.metrics_token_file()).unwrap()
}

#[test]
fn every_daemon_serves_metrics_that_promtool_accepts_and_that_move() {
    let c = Cluster::start_metrics(2, "32MiB");
    let t = token(&c);
    let daemons = ["master", "node-0", "node-1"];
    for d in daemons {
        let addr = c.metrics_addr(d).unwrap();
        assert_eq!(
            get(&addr, "/metrics", None).0,
            401,
            "{d} served without a token"
        );
        assert_eq!(get(&addr, "/metrics", Some("wrong")).0, 401);
        assert_eq!(get(&addr, "/other", Some(&t)).0, 404);
    }
    let node1 = c.metrics_addr("node-1").unwrap();
    let master = c.metrics_addr("master").unwrap();
    let written = r#"oncilla_data_bytes_total{fabric="tcp",op="write"}"#;
    let before = sample(&get(&node1, "/metrics", Some(&t)).1, written).unwrap_or(0.0);

    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(3 << 20, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .fabric(Fabric::Tcp),
        )
        .unwrap();
    a.copy_in(0, &vec![7u8; 3 << 20]).unwrap();

    let (code, text) = get(&node1, "/metrics", Some(&t));
    assert_eq!(code, 200);
    let after = sample(&text, written).unwrap();
    assert!(
        after - before >= f64::from(3 << 20),
        "bytes written went {before} -> {after}"
    );
    assert!(sample(&text, r#"oncilla_pool_bytes{state="used"}"#).unwrap() >= f64::from(3 << 20));
    assert_eq!(sample(&text, "oncilla_pool_allocations"), Some(1.0));
    let m = get(&master, "/metrics", Some(&t)).1;
    assert_eq!(
        sample(
            &m,
            r#"oncilla_master_allocations{health="healthy",kind="remote_host"}"#
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, r#"oncilla_master_nodes{state="up"}"#), Some(2.0));
    // Same-node memory is granted by the map socket (fabric shm).
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    local.copy_in(0, &[3u8; 4096]).unwrap();
    // Every request is counted before the reply that completes it, so
    // what a client has seen done is in the next scrape: no waiting.
    let node0 = c.metrics_addr("node-0").unwrap();
    let text = get(&node0, "/metrics", Some(&t)).1;
    let maps = sample(
        &text,
        r#"oncilla_data_requests_total{fabric="shm",op="map"}"#,
    );
    assert!(
        maps.is_some_and(|n| n >= 1.0),
        "no map grant counted: {maps:?}"
    );
    drop(local);
    assert_eq!(sample(&m, "oncilla_master_recovering"), Some(0.0));

    let promtool = Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("skipped promtool check metrics: no promtool (Debian package prometheus)");
        return;
    }
    for d in daemons {
        let (_, body) = get(&c.metrics_addr(d).unwrap(), "/metrics", Some(&t));
        let mut p = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool on {d}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(a);
}

/// A Prometheus server, killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The first value of an instant query's answer, if it has one.
fn query(addr: &str, q: &str) -> Option<f64> {
    let (code, body) = get(addr, &format!("/api/v1/query?query={}", encode(q)), None);
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn a_real_prometheus_scrapes_the_cluster_and_answers_promql() {
    let bin = Path::new("/usr/bin/prometheus");
    if !bin.exists() {
        eprintln!("skipped a_real_prometheus_scrapes_the_cluster_and_answers_promql: no prometheus (Debian package prometheus)");
        return;
    }
    let c = Cluster::start_metrics(2, "32MiB");
    let targets: Vec<String> = ["master", "node-0", "node-1"]
        .iter()
        .map(|d| format!("'{}'", c.metrics_addr(d).unwrap()))
        .collect();
    let config = c.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: oncilla\n    authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: [{}]\n",
            c.metrics_token_file().display(),
            targets.join(", ")
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", oncilla_cluster::free_port().unwrap());
    let log = std::fs::File::create(c.dir.join("prometheus.log")).unwrap();
    let _prom = Prometheus(
        Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                c.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    // Every target up.
    let up = || query(&listen, "sum(up{job=\"oncilla\"})") == Some(3.0);
    assert!(
        Cluster::eventually(BOUND, up),
        "prometheus did not scrape all three daemons; its log: {}",
        std::fs::read_to_string(c.dir.join("prometheus.log")).unwrap_or_default()
    );
    // Change something, and ask Prometheus about it.
    let ocm = c.client(0);
    let a = ocm
        .alloc_with(
            &AllocSpec::new(5 << 20, Kind::RemoteHost)
                .on_nodes(["node-1"])
                .fabric(Fabric::Tcp),
        )
        .unwrap();
    a.copy_in(0, &vec![1u8; 5 << 20]).unwrap();
    let q = r#"sum(oncilla_data_bytes_total{op="write",instance=~".+"})"#;
    let started = Instant::now();
    let mut seen = None;
    assert!(
        Cluster::eventually(BOUND, || {
            seen = query(&listen, q);
            seen.is_some_and(|v| v >= f64::from(5 << 20))
        }),
        "PromQL {q} answered {seen:?} after {:?}",
        started.elapsed()
    );
    eprintln!("PromQL {q} = {seen:?}");
    let allocs = r#"sum(oncilla_master_allocations{kind="remote_host"})"#;
    assert!(Cluster::eventually(BOUND, || query(&listen, allocs) == Some(1.0)));

    // Every query of the Grafana dashboard is valid PromQL here and
    // names only metrics the daemons serve.
    let t = token(&c);
    let served: String = ["master", "node-0", "node-1"]
        .iter()
        .map(|d| get(&c.metrics_addr(d).unwrap(), "/metrics", Some(&t)).1)
        .collect();
    for expr in dashboard_queries() {
        let (code, body) = get(
            &listen,
            &format!("/api/v1/query?query={}", encode(&expr)),
            None,
        );
        assert_eq!(code, 200, "dashboard query {expr}: {body}");
        for name in metric_names(&expr) {
            assert!(
                served.contains(&format!("# TYPE {name} ")),
                "the dashboard uses {name}, which no daemon serves"
            );
        }
    }
    drop(a);
}

/// The PromQL of every panel of `deploy/grafana/oncilla.json`.
fn dashboard_queries() -> Vec<String> {
    let text = include_str!("../../deploy/grafana/oncilla.json");
    let d: serde_json::Value = serde_json::from_str(text).unwrap();
    let queries: Vec<String> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 9, "the dashboard lost its panels");
    queries
}

/// The `oncilla_*` metric families `expr` reads (histogram series named
/// by their family).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("oncilla_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        names.push(name.strip_suffix("_bucket").unwrap_or(name).to_string());
        rest = &tail[end..];
    }
    names
}
