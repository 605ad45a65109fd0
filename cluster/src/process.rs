//! One daemon process as the launcher handles it: started with its log
//! (appended across restarts) and tied to the launcher's life, signalled,
//! and its log's last lines read back; and the free loopback ports the
//! daemons listen on. It decides nothing about a cluster.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::config::{Config, Daemon};
use crate::error::ClusterError;

/// SIGTERM to `child`.
pub(crate) fn terminate(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// This program's name, for the few lines the launcher prints itself.
pub(crate) fn program() -> String {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "oncilla-cluster".into())
}

/// Starts daemon `name` with `args`, logging to `DIR/NAME.log`.
pub(crate) fn spawn(
    config: &Config,
    dir: &Path,
    name: &str,
    args: &[String],
) -> Result<Child, ClusterError> {
    let log_path = dir.join(format!("{name}.log"));
    // Appended: a restarted daemon's log follows its predecessor's.
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|source| ClusterError::io(&log_path, source))?;
    let mut cmd = match &config.daemon {
        Daemon::Binary(path) => Command::new(path),
        Daemon::ReExec(arg) => {
            let mut cmd = Command::new(std::env::current_exe().map_err(ClusterError::OwnExe)?);
            cmd.arg(arg);
            cmd
        }
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if !config.inherit_oncilla_env {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ONCILLA_") {
                cmd.env_remove(k);
            }
        }
    }
    for (k, v) in &config.env {
        cmd.env(k, v);
    }
    if config.keep {
        // Its own process group: a later Ctrl-C in this shell leaves it running.
        cmd.process_group(0);
    } else {
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of the parent; it makes the daemon get SIGTERM if the
        // thread that started it dies without cleaning up, so no process is
        // left behind.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().map_err(|source| ClusterError::Spawn {
        name: name.to_string(),
        source,
    })
}

/// A loopback port free right now, below the kernel's ephemeral range
/// (32768 and up by default), so that no outgoing connection (another
/// test's, say) takes it as its source port before the daemon binds it.
pub fn free_port() -> Result<u16, ClusterError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) * 7919 + NEXT.fetch_add(1, Ordering::Relaxed) * 131;
    (0..2000u64)
        .map(|i| 20000 + u16::try_from((seed + i * 17) % 12000).unwrap_or(0))
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .ok_or(ClusterError::NoPort)
}

/// The last `lines` lines of a log.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    last_lines(&std::fs::read_to_string(path).unwrap_or_default(), lines)
}

/// The last `lines` lines of `text`.
pub(crate) fn last_lines(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A new private (mode 0700) directory in the temporary directory, named
/// `PREFIX-PID-RANDOM`.
pub(crate) fn private_dir(prefix: &str) -> Result<PathBuf, ClusterError> {
    private_dir_in(&std::env::temp_dir(), prefix)
}

/// A new private (mode 0700) directory in `base`, named
/// `PREFIX-PID-RANDOM`.
pub(crate) fn private_dir_in(base: &Path, prefix: &str) -> Result<PathBuf, ClusterError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = base.join(format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| ClusterError::io(&dir, source))?;
    Ok(dir)
}

/// The bytes free to an unprivileged writer on the file system that holds
/// `path`, or `None` where it cannot be read.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    Some(st.blocks_available().saturating_mul(st.fragment_size()))
}
