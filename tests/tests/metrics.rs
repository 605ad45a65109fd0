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
    // Every series about a daemon names its node.
    let written = r#"oncilla_data_bytes_total{fabric="tcp",op="write",node="node-1"}"#;
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
    assert!(
        sample(&text, r#"oncilla_pool_bytes{state="used",node="node-1"}"#).unwrap()
            >= f64::from(3 << 20)
    );
    assert_eq!(
        sample(&text, r#"oncilla_pool_allocations{node="node-1"}"#),
        Some(1.0)
    );
    // The pool's states sum to its capacity.
    let states: f64 = ["used", "free", "refilling"]
        .iter()
        .map(|s| {
            sample(
                &text,
                &format!(r#"oncilla_pool_bytes{{state="{s}",node="node-1"}}"#),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(
        Some(states),
        sample(&text, r#"oncilla_pool_capacity_bytes{node="node-1"}"#)
    );
    assert!(sample(&text, r#"process_resident_memory_bytes{node="node-1"}"#).unwrap() > 0.0);
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
    assert_eq!(
        sample(&m, "oncilla_master_allocations_made_total"),
        Some(1.0),
        "{m}"
    );
    // A request no node has room for is counted by its reason.
    let refused = ocm.alloc_with(&AllocSpec::new(1 << 40, Kind::RemoteHost));
    assert!(
        matches!(refused, Err(liboncilla::Error::CapacityExhausted(_))),
        "{refused:?}"
    );
    let m = get(&master, "/metrics", Some(&t)).1;
    assert_eq!(
        sample(
            &m,
            r#"oncilla_master_allocation_failures_total{reason="capacity"}"#
        ),
        Some(1.0),
        "{m}"
    );
    // Same-node memory is granted by the map socket (fabric shm).
    let local = ocm.alloc(1 << 20, Kind::LocalHost).unwrap();
    local.copy_in(0, &[3u8; 4096]).unwrap();
    // Every request is counted before the reply that completes it, so
    // what a client has seen done is in the next scrape: no waiting.
    let node0 = c.metrics_addr("node-0").unwrap();
    let text = get(&node0, "/metrics", Some(&t)).1;
    let maps = sample(
        &text,
        r#"oncilla_data_requests_total{fabric="shm",op="map",node="node-0"}"#,
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

/// Before, any peer held all 16 metrics connections (idle and
/// reconnecting, or kept alive with an unauthenticated GET every few
/// seconds): legitimate scrapes succeeded 0 of 14. Now a connection that
/// has not presented the token waits in a small budget of its own (the
/// oldest evicted), a request without the token ends its connection, and
/// only connections with the token take one of the 16 seats: every scrape
/// is served during the attack, and what the strangers hold stays within
/// that budget.
#[test]
fn strangers_cannot_take_the_metrics_listener() {
    use std::io::Read as _;
    let c = Cluster::start_metrics(1, "16MiB");
    let t = token(&c);
    let addr = c.metrics_addr("node-0").unwrap();
    let connect = || {
        let s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    // Idle strangers, and strangers that speak without the token.
    let idle: Vec<_> = (0..40).map(|_| connect()).collect();
    let mut talkers: Vec<_> = (0..40).map(|_| connect()).collect();
    for s in &mut talkers {
        let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    for s in &mut talkers {
        // Answered 401 and closed: read to the end (bounded by the timeout).
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 401"),
            "{reply}"
        );
    }
    let mut served = 0;
    for _ in 0..20 {
        let (code, body) = get(&addr, "/metrics", Some(&t));
        if code == 200 && body.contains("oncilla_") {
            served += 1;
        }
    }
    assert_eq!(served, 20, "scrapes served during the attack");
    // What strangers still hold: within the pending budget (16).
    let open = idle
        .iter()
        .chain(&talkers)
        .filter(|s| !support::tcp_closed(s))
        .count();
    assert!(open <= 16, "{open} stranger connections still open");
    c.still_serves();
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

/// The alert rules the project ships.
fn alert_rules() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/oncilla-alerts.yml")
}

/// The series `q` answers (each one's labels), or nothing.
fn series(addr: &str, q: &str) -> Vec<serde_json::Value> {
    let (code, body) = get(addr, &format!("/api/v1/query?query={}", encode(q)), None);
    if code != 200 {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .map(|r| r.iter().map(|s| s["metric"].clone()).collect())
        .unwrap_or_default()
}

/// The shipped alert rules pass `promtool check rules` and their unit tests
/// (`deploy/prometheus/oncilla-alerts.test.yml`: each alert fires when it
/// should and stays quiet when it should not).
#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let promtool = Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("skipped the_alert_rules_check_and_pass_their_unit_tests: no promtool (Debian package prometheus)");
        return;
    }
    let dir = alert_rules().parent().unwrap().to_path_buf();
    for args in [
        ["check", "rules", "oncilla-alerts.yml"],
        ["test", "rules", "oncilla-alerts.test.yml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A Prometheus server scraping `daemons` of `c` every second with the
/// metrics token (`job` adds lines to the job, indented four spaces) and
/// the shipped alert rules loaded, and the address of its HTTP API.
fn prometheus(bin: &Path, c: &Cluster, daemons: &[&str], job: &str) -> (Prometheus, String) {
    let targets: Vec<String> = daemons
        .iter()
        .map(|d| format!("'{}'", c.metrics_addr(d).unwrap()))
        .collect();
    let config = c.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  - job_name: oncilla\n    authorization:\n      credentials_file: {}\n{job}    static_configs:\n      - targets: [{}]\n",
            alert_rules().display(),
            c.metrics_token_file().display(),
            targets.join(", ")
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", oncilla_cluster::free_port().unwrap());
    let log = std::fs::File::create(c.dir.join("prometheus.log")).unwrap();
    let prom = Prometheus(
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
    (prom, listen)
}

#[test]
fn a_real_prometheus_scrapes_the_cluster_and_answers_promql() {
    let bin = Path::new("/usr/bin/prometheus");
    if !bin.exists() {
        eprintln!("skipped a_real_prometheus_scrapes_the_cluster_and_answers_promql: no prometheus (Debian package prometheus)");
        return;
    }
    let c = Cluster::start_metrics(2, "32MiB");
    let (_prom, listen) = prometheus(bin, &c, &["master", "node-0", "node-1"], "");
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
    let made = "sum(oncilla_master_allocations_made_total)";
    assert!(Cluster::eventually(BOUND, || query(&listen, made) >= Some(1.0)));

    // The alert rules are loaded and evaluate, and their joins meet on the
    // labels the daemons serve: every node's pool, each under its `node`,
    // and every node the leading master hears.
    let (code, body) = get(&listen, "/api/v1/rules", None);
    assert_eq!(code, 200, "{body}");
    let rules: serde_json::Value = serde_json::from_str(&body).unwrap();
    let group = &rules["data"]["groups"][0];
    assert_eq!(group["name"], "oncilla", "{body}");
    assert_eq!(group["rules"].as_array().map(Vec::len), Some(6), "{body}");
    let evaluated = || {
        let (_, body) = get(&listen, "/api/v1/rules", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["groups"][0]["rules"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["health"] == "ok"))
    };
    assert!(
        Cluster::eventually(BOUND, evaluated),
        "a rule does not evaluate: {body}"
    );
    let used = r#"sum by (node) (oncilla_pool_bytes{state="used"}) / sum by (node) (oncilla_pool_capacity_bytes)"#;
    let pools = || {
        let mut nodes: Vec<String> = series(&listen, used)
            .iter()
            .filter_map(|s| s["node"].as_str().map(String::from))
            .collect();
        nodes.sort();
        nodes == ["node-0", "node-1"]
    };
    assert!(
        Cluster::eventually(BOUND, pools),
        "{used}: {:?}",
        series(&listen, used)
    );
    let heard = "max by (node) (oncilla_master_node_heartbeat_age_seconds * on (instance) group_left oncilla_master_leading)";
    assert!(
        Cluster::eventually(BOUND, || series(&listen, heard).len() == 2),
        "{heard}: {:?}",
        series(&listen, heard)
    );

    // Every query of the Grafana dashboard is valid PromQL here and
    // names only metrics the daemons serve.
    let t = token(&c);
    let served: String = ["master", "node-0", "node-1"]
        .iter()
        .map(|d| get(&c.metrics_addr(d).unwrap(), "/metrics", Some(&t)).1)
        .collect();
    for expr in dashboard_queries() {
        // As Grafana sends it with "All" chosen for every variable.
        let expr = expr.replace("$job", ".*").replace("$cluster", ".*");
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

/// One HTTPS GET of `/metrics` at `addr` trusting only the CA at `ca`,
/// with `bearer`: the status code and the body (0: no HTTP answer).
fn https_get(addr: &str, ca: &Path, bearer: &str) -> (u16, String) {
    use std::io::Read as _;
    let tls = oncilla_net::tls::ClientTls::load(ca).unwrap();
    let host = oncilla_net::tls::host_of(addr).to_string();
    let name = rustls::pki_types::ServerName::try_from(host).unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::clone(tls.data()), name).unwrap();
    let sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {bearer}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = Vec::new();
    // Up to the end of the stream; a peer that closes without TLS's
    // close_notify ends it with an error, after what it sent.
    let _ = s.read_to_end(&mut reply);
    support::parse_http(&String::from_utf8_lossy(&reply))
}

/// Before, metrics stayed plain HTTP in a TLS cluster, so the scrape token
/// crossed the network in clear. Now the endpoint speaks HTTPS with the
/// daemon's certificate there: a plaintext scrape gets no answer, one that
/// trusts the cluster CA is served, and a real Prometheus (`scheme:
/// https`, the CA as `ca_file`) scrapes every daemon.
#[test]
fn metrics_speak_tls_in_a_tls_cluster() {
    let c = Cluster::start_tls_metrics(1, "16MiB");
    let t = token(&c);
    let ca = c.tls_ca().unwrap();
    for d in ["master", "node-0"] {
        let addr = c.metrics_addr(d).unwrap();
        let (code, body) = get(&addr, "/metrics", Some(&t));
        assert_ne!(code, 200, "{d} answered plaintext: {body}");
        let (code, body) = https_get(&addr, &ca, &t);
        assert_eq!(code, 200, "{d} over TLS: {body}");
        assert!(body.contains("# TYPE oncilla_"), "{d}: {body}");
        assert_eq!(https_get(&addr, &ca, "wrong").0, 401);
    }
    let bin = Path::new("/usr/bin/prometheus");
    if !bin.exists() {
        eprintln!("skipped the Prometheus part: no prometheus (Debian package prometheus)");
        return;
    }
    let job = format!(
        "    scheme: https\n    tls_config:\n      ca_file: {}\n",
        ca.display()
    );
    let (_prom, listen) = prometheus(bin, &c, &["master", "node-0"], &job);
    let up = || query(&listen, "sum(up{job=\"oncilla\"})") == Some(2.0);
    assert!(
        Cluster::eventually(BOUND, up),
        "prometheus did not scrape both daemons over TLS; its log: {}",
        std::fs::read_to_string(c.dir.join("prometheus.log")).unwrap_or_default()
    );
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
