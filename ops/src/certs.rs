//! A cluster CA and the certificates its daemons serve, for clusters whose
//! TCP listeners speak TLS (`ocmctl tls-ca`, `ocmctl tls-cert`, and local
//! clusters started with TLS), and the one way files are written here:
//! a new file of exactly the mode asked (whatever the umask), made beside
//! the path and renamed onto it, so a symlink or a file someone planted at
//! the path is replaced, never followed or written into.
//!
//! It only makes files; what trusts them is `oncilla_net::tls`. A CA's
//! key never leaves the directory it was made in; operators who have their
//! own PKI use it instead and skip these commands.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The CA certificate's file name in its directory (what every component
/// trusts: `--tls-ca`).
pub const CA_CERT: &str = "ca.pem";
/// The CA key's file name (mode 0600; needed only to make certificates).
pub const CA_KEY: &str = "ca-key.pem";
/// Most host names or addresses one certificate carries.
pub const MAX_HOSTS: usize = 64;

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} exists; remove it first (a new CA would orphan every certificate it signed)", path.display())]
    Exists { path: PathBuf },
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("cannot make the certificate: {0}")]
    Make(#[from] rcgen::Error),
}

/// The files of one daemon's certificate.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// `--tls-cert`.
    pub cert: PathBuf,
    /// `--tls-key` (mode 0600).
    pub key: PathBuf,
}

/// Writes `bytes` to `path`, readable and writable by its owner only.
///
/// # Errors
/// As [`oncilla_net::auth::write_new`].
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), std::io::Error> {
    oncilla_net::auth::write_new(path, bytes, 0o600)
}

/// Writes `bytes` to `path`, writable by its owner only, readable by all
/// (certificates).
///
/// # Errors
/// As [`oncilla_net::auth::write_new`].
pub fn write_public(path: &Path, bytes: &[u8]) -> Result<(), std::io::Error> {
    oncilla_net::auth::write_new(path, bytes, 0o644)
}

/// Makes directory `dir` (and its parents) where it is missing, the ones
/// made here of mode 0755 whatever the umask: no one else may add or
/// replace files in them.
///
/// # Errors
/// A directory cannot be made.
pub fn make_dir(dir: &Path) -> Result<(), std::io::Error> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_dir(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Oncilla cluster CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p
}

/// Makes a new cluster CA in `dir` ([`CA_CERT`], [`CA_KEY`]); refuses to
/// replace one. Returns the certificate's path.
///
/// # Errors
/// [`CertError::Exists`]; the files cannot be written.
pub fn make_ca(dir: &Path) -> Result<PathBuf, CertError> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(CertError::Exists { path: path.clone() });
        }
    }
    make_dir(dir).map_err(|source| CertError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let key = KeyPair::generate()?;
    let cert = ca_params().self_signed(&key)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Io { path, source }
    };
    write_private(&key_path, key.serialize_pem().as_bytes()).map_err(io(&key_path))?;
    write_public(&cert_path, cert.pem().as_bytes()).map_err(io(&cert_path))?;
    Ok(cert_path)
}

/// Makes daemon `name`'s certificate, signed by the CA in `ca_dir`, valid
/// for each of `hosts` (the host names and addresses clients dial it by:
/// its `--advertise` address, or the address it listens on), as
/// `NAME.pem` and `NAME-key.pem` (mode 0600) in `out`.
///
/// # Errors
/// A bad name or host list; the CA cannot be read; the files cannot be
/// written.
pub fn make_cert(
    ca_dir: &Path,
    name: &str,
    hosts: &[String],
    out: &Path,
) -> Result<CertFiles, CertError> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(CertError::Invalid {
            what: format!("name {name:?}"),
            reason: "use 1 to 128 letters, digits, '-', '_' or '.'".into(),
        });
    }
    if hosts.is_empty() || hosts.len() > MAX_HOSTS {
        return Err(CertError::Invalid {
            what: "--host".into(),
            reason: format!(
                "give 1 to {MAX_HOSTS} host names or addresses the daemon is dialled by"
            ),
        });
    }
    let key_path = ca_dir.join(CA_KEY);
    let ca_key_pem = std::fs::read_to_string(&key_path).map_err(|source| CertError::Io {
        path: key_path.clone(),
        source,
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| CertError::Invalid {
        what: key_path.display().to_string(),
        reason: format!("not a CA key made by `ocmctl tls-ca`: {e}"),
    })?;
    // The same subject and key as the CA certificate on disk: what a
    // signature needs of its issuer.
    let ca = ca_params().self_signed(&ca_key)?;
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(|e| CertError::Invalid {
        what: "--host".into(),
        reason: e.to_string(),
    })?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    make_dir(out).map_err(|source| CertError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let files = CertFiles {
        cert: out.join(format!("{name}.pem")),
        key: out.join(format!("{name}-key.pem")),
    };
    write_private(&files.key, key.serialize_pem().as_bytes()).map_err(|source| CertError::Io {
        path: files.key.clone(),
        source,
    })?;
    write_public(&files.cert, cert.pem().as_bytes()).map_err(|source| CertError::Io {
        path: files.cert.clone(),
        source,
    })?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncilla_net::tls::{tunnel, ClientTls, ServerTls};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "oncilla-certs-{tag}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A CA in `dir` and a server certificate for `hosts`.
    fn pki(dir: &Path, hosts: &[&str]) -> (ServerTls, ClientTls) {
        let ca = make_ca(dir).unwrap();
        let hosts: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        let files = make_cert(dir, "node-0", &hosts, dir).unwrap();
        (
            ServerTls::load(&files.cert, &files.key).unwrap(),
            ClientTls::load(&ca).unwrap(),
        )
    }

    /// Serves one connection that echoes what it reads; returns the
    /// address and the server's outcome.
    fn echo_server(server: ServerTls) -> (String, std::thread::JoinHandle<std::io::Result<u64>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (tcp, _) = l.accept()?;
            let until = Instant::now() + Duration::from_secs(5);
            let mut s = tunnel::accept(tcp, server.data(), until, Duration::from_secs(5))?;
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    return Ok(total);
                }
                s.write_all(&buf[..n])?;
                total += n as u64;
            }
        });
        (addr, t)
    }

    fn dial(addr: &str, trust: &ClientTls, host: &str) -> std::io::Result<tunnel::DataStream> {
        let tcp = TcpStream::connect(addr)?;
        let until = Instant::now() + Duration::from_secs(5);
        tunnel::connect(tcp, trust.data(), host, until, Duration::from_secs(5))
    }

    #[test]
    fn bytes_cross_a_tunnel_intact_both_ways_and_its_end_is_seen() {
        let dir = scratch("echo");
        let (server, trust) = pki(&dir, &["127.0.0.1"]);
        let (addr, t) = echo_server(server);
        let s = dial(&addr, &trust, "127.0.0.1").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let sent: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
        let mut w = match &s {
            tunnel::DataStream::Tls(u) => u.try_clone().unwrap(),
            tunnel::DataStream::Tcp(_) => panic!("a TLS dial gave a plain socket"),
        };
        let data = sent.clone();
        let writer = std::thread::spawn(move || w.write_all(&data));
        let mut got = vec![0u8; sent.len()];
        let mut r = s;
        r.read_exact(&mut got).unwrap();
        writer.join().unwrap().unwrap();
        assert!(got == sent, "echoed bytes differ");
        drop(r);
        assert_eq!(t.join().unwrap().unwrap(), sent.len() as u64);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn data_that_comes_in_with_the_handshake_is_not_held_back() {
        let dir = scratch("early");
        let (server, trust) = pki(&dir, &["127.0.0.1"]);
        let (addr, t) = echo_server(server);
        let mut tcp = TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::clone(trust.data()), name).unwrap();
        // Written before the handshake: rustls sends it right behind the
        // client's Finished, so the server reads both in one go.
        c.writer().write_all(b"ping").unwrap();
        let mut s = rustls::Stream::new(&mut c, &mut tcp);
        let mut got = [0u8; 4];
        s.read_exact(&mut got)
            .expect("the echo of data sent with the Finished");
        assert_eq!(&got, b"ping");
        drop(tcp);
        assert_eq!(t.join().unwrap().unwrap(), 4);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_server_outside_the_cluster_ca_or_the_dialled_name_is_refused() {
        let (dir, other) = (scratch("name"), scratch("other"));
        let (server, trust) = pki(&dir, &["127.0.0.1"]);
        let (_, stranger_trust) = pki(&other, &["127.0.0.1"]);

        let (addr, t) = echo_server(server.clone());
        let e = dial(&addr, &stranger_trust, "127.0.0.1").unwrap_err();
        assert!(e.to_string().contains("invalid peer certificate"), "{e}");
        assert!(
            t.join().unwrap().is_err(),
            "the server went on after a refused handshake"
        );

        let (addr, t) = echo_server(server);
        let e = dial(&addr, &trust, "localhost").unwrap_err();
        assert!(e.to_string().contains("not valid for name"), "{e}");
        assert!(t.join().unwrap().is_err());
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::remove_dir_all(other).unwrap();
    }

    #[test]
    fn a_plaintext_peer_or_a_silent_one_gets_nothing_past_the_handshake() {
        let dir = scratch("plain");
        let (server, _) = pki(&dir, &["127.0.0.1"]);
        let (addr, t) = echo_server(server.clone());
        let mut tcp = TcpStream::connect(&addr).unwrap();
        // What a plain data client sends first: not a ClientHello.
        tcp.write_all(&[0u8; 64]).unwrap();
        assert!(t.join().unwrap().is_err());

        let (addr, t) = echo_server(server);
        let started = Instant::now();
        let _silent = TcpStream::connect(&addr).unwrap();
        let e = t.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(started.elapsed() < Duration::from_secs(8));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_ca_is_never_replaced_and_names_and_hosts_are_checked() {
        let dir = scratch("checks");
        make_ca(&dir).unwrap();
        assert!(matches!(make_ca(&dir), Err(CertError::Exists { .. })));
        assert!(make_cert(&dir, "../x", &["h".into()], &dir).is_err());
        assert!(make_cert(&dir, "n", &[], &dir).is_err());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
