//! Passes the signals that would end `ocmctl run` (SIGINT, SIGTERM,
//! SIGHUP) on to its program instead, while the program runs: ocmctl then
//! waits for it and tears the cluster down, so a Ctrl-C or a `kill` leaves
//! neither the program nor a daemon running. It only forwards; what the
//! program does with the signal is its own affair.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The signals forwarded.
const FORWARDED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// The program's pid while it runs; 0 otherwise (nothing is forwarded).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The handler: sends the same signal to the program. Only
/// async-signal-safe calls: an atomic load and kill(2).
extern "C" fn forward(sig: nix::libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; `pid` is our own child
        // (it is reset before the child is reaped, so never a reused pid).
        unsafe {
            nix::libc::kill(pid, sig);
        }
    }
}

/// Forwarding in force: the handlers it replaced come back on drop.
pub struct Forwarding {
    previous: Vec<(Signal, SigAction)>,
}

impl Forwarding {
    /// Forwards [`FORWARDED`] to process `pid` until dropped. A signal
    /// whose handler cannot be set keeps its old one (logged nowhere:
    /// ocmctl then ends on it as before).
    pub fn to(pid: u32) -> Self {
        CHILD.store(i32::try_from(pid).unwrap_or(0), Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(forward),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let previous = FORWARDED
            .iter()
            .filter_map(|&sig| {
                // SAFETY: the handler only loads an atomic and calls
                // kill(2), both async-signal-safe; it touches no lock and
                // allocates nothing.
                unsafe { signal::sigaction(sig, &action) }
                    .ok()
                    .map(|old| (sig, old))
            })
            .collect();
        Self { previous }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        // The child has been reaped (or is being): forward nothing more,
        // then put the old handlers back.
        CHILD.store(0, Ordering::SeqCst);
        for (sig, old) in &self.previous {
            // SAFETY: restores the action that was in place before `to`,
            // exactly as the kernel returned it.
            let _ = unsafe { signal::sigaction(*sig, old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::Pid;

    /// A SIGTERM to this process while forwarding reaches the child, and
    /// this process lives on.
    #[test]
    fn a_signal_goes_to_the_program_not_to_ocmctl() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let forwarding = Forwarding::to(pid);
        signal::kill(Pid::this(), Signal::SIGTERM).unwrap();
        let status = child.wait().unwrap();
        drop(forwarding);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
        // Reaped: no such process any more.
        let gone = signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), None);
        assert!(gone.is_err());
    }
}
