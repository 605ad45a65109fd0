//! The configuration's merging and checks, flag by flag.

use super::*;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("oncillad").chain(args.iter().copied())).unwrap()
}

#[test]
fn elections_and_master_lists_are_checked_at_start() {
    let token = "0123456789abcdef0123456789abcdef";
    let master = |extra: &[&str]| {
        let mut args = vec!["--master", "--token", token];
        args.extend_from_slice(extra);
        Config::load(cli(&args))
    };
    let c = master(&["--etcd", "http://a:2379, http://b:2379"]).unwrap();
    assert_eq!(
        c.election,
        Some(Election {
            etcd: vec!["http://a:2379".into(), "http://b:2379".into()],
            lease: std::time::Duration::from_secs(DEFAULT_LEASE_SECS),
            prefix: "oncilla".into(),
        })
    );
    assert!(c.describe().contains("etcd_lease_secs = 5"));
    assert!(master(&[]).unwrap().election.is_none());
    assert!(matches!(
        master(&["--etcd", "a:2379"]),
        Err(ConfigError::EtcdUrl(_))
    ));
    assert!(matches!(
        master(&["--etcd", "http://a:2379", "--etcd-lease-secs", "1"]),
        Err(ConfigError::EtcdLease(1))
    ));
    assert!(matches!(
        master(&["--etcd-lease-secs", "5"]),
        Err(ConfigError::LeaseWithoutEtcd)
    ));
    assert!(matches!(
        master(&["--etcd", "https://a:2379"]),
        Err(ConfigError::EtcdTls(_))
    ));
    assert!(matches!(
        master(&["--etcd", "http://a:2379", "--etcd-lease-secs", "31"]),
        Err(ConfigError::EtcdLease(31))
    ));
    assert!(matches!(
        master(&["--etcd", "http://a:2379", "--etcd-prefix", "a b"]),
        Err(ConfigError::EtcdPrefix(_))
    ));
    let c = master(&["--etcd", "http://a:2379", "--etcd-prefix", "team-a.prod"]).unwrap();
    assert_eq!(c.election.unwrap().prefix, "team-a.prod");
    assert!(matches!(
        master(&["--etcd", "http://a:2379", "--etcd-prefix", "a/b"]),
        Err(ConfigError::EtcdPrefix(_))
    ));
    assert!(matches!(
        master(&[
            "--etcd",
            "http://a:2379",
            "--etcd-lease-secs",
            "30",
            "--heartbeat-ms",
            "10000"
        ]),
        Err(ConfigError::TakeoverTooLong { .. })
    ));
    let agent = |extra: &[&str]| {
        let mut args = vec!["--capacity", "1MiB", "--token", token, "--hugepages", "off"];
        args.extend_from_slice(extra);
        Config::load(cli(&args))
    };
    assert!(matches!(
        agent(&["--join", "m:1", "--etcd", "http://a:2379"]),
        Err(ConfigError::EtcdOnAgent)
    ));
    let c = agent(&["--join", "m:1,n:2"]).unwrap();
    assert_eq!(c.agent.unwrap().join, ["m:1", "n:2"]);
    for bad in ["m", "m:1,", ":1", "m:0", "m:x"] {
        assert!(
            matches!(agent(&["--join", bad]), Err(ConfigError::Join(_))),
            "{bad}"
        );
    }
}

#[test]
fn flags_beat_file() {
    let dir = std::env::temp_dir().join(format!("oncilla-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "join = \"m:1\"\ncapacity = \"1MiB\"\ntoken = \"0123456789abcdef0123456789abcdef\"\nname = \"fromfile\"\nhugepages = \"off\"\n",
    )
    .unwrap();
    let c = Config::load(cli(&["--config", file.to_str().unwrap(), "--name", "flag"])).unwrap();
    assert_eq!(c.name, "flag");
    let agent = c.agent.unwrap();
    assert_eq!(agent.capacity, 1 << 20);
    assert_eq!(agent.join, ["m:1"]);
    assert_eq!(agent.huge_pages, HugePages::Off);
    std::fs::write(&file, "bogus = 1\n").unwrap();
    let err = Config::load(cli(&["--config", file.to_str().unwrap()])).unwrap_err();
    assert!(err.to_string().contains("unknown field"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn validates_roles_and_sizes() {
    assert!(matches!(
        Config::load(cli(&["--token", "0123456789abcdef0123456789abcdef"])),
        Err(ConfigError::NoRole)
    ));
    assert!(matches!(
        Config::load(cli(&[
            "--join",
            "m:1",
            "--token",
            "0123456789abcdef0123456789abcdef"
        ])),
        Err(ConfigError::NoCapacity)
    ));
    let err = Config::load(cli(&[
        "--join",
        "m:1",
        "--token",
        "0123456789abcdef0123456789abcdef",
        "--capacity",
        "12XB",
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("unknown unit"), "{err}");
    assert!(matches!(
        Config::load(cli(&["--master"])),
        Err(ConfigError::Token(_))
    ));
}

#[test]
fn tls_takes_all_three_files_and_a_private_key() {
    let base = ["--master", "--token", "0123456789abcdef0123456789abcdef"];
    let with = |extra: &[&str]| Config::load(cli(&[&base[..], extra].concat()));
    assert!(matches!(
        with(&["--tls-cert", "c.pem"]),
        Err(ConfigError::TlsPartial("--tls-key"))
    ));
    assert!(matches!(
        with(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]),
        Err(ConfigError::TlsPartial("--tls-ca"))
    ));
    assert!(matches!(
        with(&["--tls-key", "k.pem", "--tls-ca", "ca.pem"]),
        Err(ConfigError::TlsPartial("--tls-cert"))
    ));
    assert!(with(&[]).unwrap().tls.is_none());
    // A key others may read is refused with its path, as a token file is.
    let dir = std::env::temp_dir().join(format!("oncilla-cfg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("k.pem");
    std::fs::write(&key, "x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(dir.join("c.pem"), "x").unwrap();
    let (c, k, ca) = (dir.join("c.pem"), key.clone(), dir.join("c.pem"));
    let e = with(&[
        "--tls-cert",
        c.to_str().unwrap(),
        "--tls-key",
        k.to_str().unwrap(),
        "--tls-ca",
        ca.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(
        e.to_string().contains("TLS private key") && e.to_string().contains("chmod 600"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_metrics_token_is_a_secret_of_its_own() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = "0123456789abcdef0123456789abcdef";
    let dir = std::env::temp_dir().join(format!("oncilla-cfg-mt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let private = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.display().to_string()
    };
    let same = private("same", cluster);
    let own = private("own", "fedcba9876543210fedcba9876543210");
    let keys = NodeKeys::derive(&Token::new(cluster).unwrap(), "n1").to_text();
    let keys = private("keys", &keys);
    fn metrics(file: &str) -> [&str; 4] {
        [
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-token-file",
            file,
        ]
    }
    for role in [
        vec!["--master", "--token", cluster],
        vec![
            "--join",
            "m:1",
            "--capacity",
            "1MiB",
            "--node-keys-file",
            &keys,
        ],
    ] {
        let e = Config::load(cli(&[&role[..], &metrics(&same)].concat())).unwrap_err();
        assert!(
            matches!(e, ConfigError::MetricsTokenIsClusterToken(_)),
            "{e}"
        );
        assert!(Config::load(cli(&[&role[..], &metrics(&own)].concat())).is_ok());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn advertises_reachable_address() {
    let c = Config::load(cli(&[
        "--master",
        "--token",
        "0123456789abcdef0123456789abcdef",
        "--advertise",
        "node7",
    ]))
    .unwrap();
    assert_eq!(c.advertised("0.0.0.0:9".parse().unwrap()), "node7:9");
    let c = Config::load(cli(&[
        "--master",
        "--token",
        "0123456789abcdef0123456789abcdef",
    ]))
    .unwrap();
    assert_eq!(c.advertised("127.0.0.2:9".parse().unwrap()), "127.0.0.2:9");
}
