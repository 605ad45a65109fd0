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

/// The handler: sends the same signal to the program, unless the
/// terminal sent it (the program, in the same process group, got it
/// already: a Ctrl-C must arrive once). Only async-signal-safe calls: an
/// atomic load, kill(2), and errno kept as it was.
extern "C" fn forward(
    sig: nix::libc::c_int,
    info: *mut nix::libc::siginfo_t,
    _context: *mut nix::libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for an SA_SIGINFO
    // handler; it is only read, and a NULL is checked.
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == nix::libc::SI_KERNEL;
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 && !from_terminal {
        let errno = nix::errno::Errno::last_raw();
        // SAFETY: kill(2) is async-signal-safe; `pid` is our own child,
        // not yet reaped: `CHILD` is reset after waitid(WNOWAIT) saw it
        // end and before it is reaped, so it is never a reused pid.
        unsafe {
            nix::libc::kill(pid, sig);
        }
        nix::errno::Errno::set_raw(errno);
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
            SigHandler::SigAction(forward),
            SaFlags::SA_RESTART | SaFlags::SA_SIGINFO,
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

impl Forwarding {
    /// Waits until the program has ended without reaping it, then stops
    /// forwarding: the caller reaps it after, so no signal can reach
    /// another process that took its pid.
    pub fn until_ended(self) {
        let pid = nix::unistd::Pid::from_raw(CHILD.load(Ordering::SeqCst));
        if pid.as_raw() > 0 {
            use nix::sys::wait::{waitid, Id, WaitPidFlag};
            let ended = || waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
            // Interrupted by a signal it forwarded: wait on.
            while let Err(nix::errno::Errno::EINTR) = ended() {}
        }
        drop(self);
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
        forwarding.until_ended();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
        // Reaped: no such process any more.
        let gone = signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), None);
        assert!(gone.is_err());
    }
}
