//! `ocmctl tls-ca` and `ocmctl tls-cert`: a cluster CA for TLS on every
//! TCP listener, and the certificates its daemons serve (the files are
//! made by `oncilla_ops::certs`).

use std::path::PathBuf;

use oncilla_ops::certs;

use crate::error::CliError;

/// Options of `ocmctl tls-ca`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct CaArgs {
    /// Directory to write into (made if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Options of `ocmctl tls-cert`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct CertArgs {
    /// The daemon's name (its --name; `master` for a master alone).
    name: String,
    /// Host name or address clients dial it by (its --advertise, or
    /// the address it listens on); repeat for each.
    #[arg(long = "host", value_name = "HOST", required = true)]
    hosts: Vec<String>,
    /// Directory holding the CA (`ocmctl tls-ca --out`).
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// Directory to write into [default: the CA's].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Makes the CA; refuses to replace one.
///
/// # Errors
/// An existing CA; files that cannot be written.
pub fn ca(args: &CaArgs) -> Result<(), CliError> {
    let out = &args.out;
    let ca = certs::make_ca(out)?;
    crate::stdout::sayln!(
        "wrote the cluster CA to {} (trust it with --tls-ca) and its key to {}",
        ca.display(),
        out.join(certs::CA_KEY).display()
    );
    Ok(())
}

/// Makes the daemon's certificate, signed by the CA.
///
/// # Errors
/// A bad name or host, no CA there; files that cannot be written.
pub fn cert(args: &CertArgs) -> Result<(), CliError> {
    let name = &args.name;
    let out = args.out.as_deref().unwrap_or(&args.ca);
    let files = certs::make_cert(&args.ca, name, &args.hosts, out)?;
    crate::stdout::sayln!(
        "wrote {name}'s certificate to {} and its key to {}",
        files.cert.display(),
        files.key.display()
    );
    Ok(())
}
