//! TLS on the cluster's TCP listeners, an option a cluster takes whole:
//! every daemon serves a certificate signed by the cluster CA on its gRPC
//! port and on its data port, and every component that dials one of them
//! trusts the cluster CA and nothing else. Credentials still say who a
//! caller is; TLS adds that nobody on the path can read or change what
//! crosses it, and that a client talks to the node it meant to.
//!
//! It owns loading the PEM files (the private key must be private, as the
//! token file must), the rustls and tonic configurations made from them,
//! and the data port's [`tunnel`]. It never decides who may do what (that
//! is [`crate::credential`]).

pub mod tunnel;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use tunnel::DataStream;

/// A whole TLS handshake on a gRPC port must fit in this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why TLS cannot be set up from the files given.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS private key {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("{what} holds no PEM certificate{detail}")]
    NoCertificate { what: String, detail: String },
    #[error("{what} holds no PEM private key{detail}")]
    NoKey { what: String, detail: String },
    #[error("the CA certificate {what} cannot be trusted: {reason}")]
    BadCa { what: String, reason: String },
    #[error("certificate and key do not make a TLS server: {0}")]
    Server(#[source] rustls::Error),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::NoCertificate {
            what: what.to_string(),
            detail: format!(" ({e})"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what: what.to_string(),
            detail: String::new(),
        });
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a daemon serves on its TCP listeners: its certificate chain and key.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
    data: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls(..)")
    }
}

impl ServerTls {
    /// The certificate chain at `cert` and the private key at `key` (a file
    /// only its owner can read).
    ///
    /// # Errors
    /// [`TlsError`] naming the file that is missing, unreadable, too open
    /// or not what it should be.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read("TLS certificate", cert)?;
        let key_pem = crate::auth::read_private(key).map_err(|e| TlsError::KeyFile {
            path: key.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_pem(
            &cert_pem,
            key_pem.as_bytes(),
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }

    /// From PEM text (`cert_name`, `key_name` name them in errors).
    ///
    /// # Errors
    /// [`TlsError`].
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        cert_name: &str,
        key_name: &str,
    ) -> Result<Self, TlsError> {
        let certs = certificates(cert_pem, cert_name)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
            what: key_name.to_string(),
            detail: format!(" ({e})"),
        })?;
        // The data port: TLS 1.3 only (both ends are ours), no session
        // tickets (nothing to resume; connections are long-lived).
        let mut data = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Server)?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(TlsError::Server)?;
        data.send_tls13_tickets = 0;
        Ok(Self {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            data: Arc::new(data),
        })
    }

    /// The gRPC servers' configuration.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The data port's configuration, and the metrics endpoint's (TLS 1.3,
    /// which Prometheus speaks; no ALPN, so HTTP/1.1 clients are served).
    pub fn data(&self) -> &Arc<rustls::ServerConfig> {
        &self.data
    }
}

/// What a component needs to dial TLS listeners: the cluster CA.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Arc<[u8]>,
    data: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls(..)")
    }
}

impl ClientTls {
    /// Trusts the CA certificate(s) at `ca`.
    ///
    /// # Errors
    /// [`TlsError`].
    pub fn load(ca: &Path) -> Result<Self, TlsError> {
        Self::from_pem(&read("TLS CA certificate", ca)?, &ca.display().to_string())
    }

    /// Trusts the CA certificate(s) in `ca_pem` (`name` names it in errors;
    /// an agent hands its sessions the PEM text).
    ///
    /// # Errors
    /// [`TlsError`].
    pub fn from_pem(ca_pem: &[u8], name: &str) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca_pem, name)? {
            roots.add(cert).map_err(|e| TlsError::BadCa {
                what: name.to_string(),
                reason: e.to_string(),
            })?;
        }
        let mut data = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::BadCa {
                what: name.to_string(),
                reason: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        data.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            ca_pem: ca_pem.into(),
            data: Arc::new(data),
        })
    }

    /// The CA's PEM text (what an agent hands its sessions).
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The gRPC clients' configuration.
    pub fn grpc(&self) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The data clients' configuration.
    pub fn data(&self) -> &Arc<rustls::ClientConfig> {
        &self.data
    }
}

/// The host part of `host:port` (`[v6]:port` too), the name a listener's
/// certificate must carry.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_strips_the_port_and_v6_brackets() {
        assert_eq!(host_of("10.0.0.1:7071"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7071"), "::1");
        assert_eq!(host_of("node-a.example:7071"), "node-a.example");
    }

    #[test]
    fn files_that_are_not_pem_are_refused_by_name() {
        let e = ClientTls::from_pem(b"not a certificate", "ca.pem").unwrap_err();
        assert!(
            e.to_string().contains("ca.pem holds no PEM certificate"),
            "{e}"
        );
        let e = ServerTls::from_pem(b"", b"", "node.pem", "node-key.pem").unwrap_err();
        assert!(
            e.to_string().contains("node.pem holds no PEM certificate"),
            "{e}"
        );
    }
}
