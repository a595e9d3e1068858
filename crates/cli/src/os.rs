//! Process settings the C library has and the Rust crates hawser uses do not wrap
//! safely: the CPU scheduling class a node runs in (`hawser start --cpu-class`), its
//! opting out of transparent huge pages (`--transparent-huge-pages`), and SIGPIPE for
//! the client commands.
//!
//! The one place hawser calls the C library directly: neither rustix nor nix offers
//! `sched_setscheduler` (and `chrt` may not be in the image a node runs from), nix's
//! `prctl` module has no `PR_SET_THP_DISABLE`, and nix's `signal` is as unsafe as
//! libc's.
#![allow(unsafe_code)]

/// Moves the calling thread into Linux's SCHED_IDLE class. Threads it starts afterwards
/// inherit the class, so called on the main thread before the runtime and the store
/// start threads, it puts the whole node there. Entering SCHED_IDLE needs no privilege;
/// leaving it needs CAP_SYS_NICE, so nothing here tries to.
#[cfg(target_os = "linux")]
pub fn enter_idle_class() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that lives across the call, pid 0 names
    // the calling thread, and the call writes no memory of this process.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot enter the idle CPU class (sched_setscheduler SCHED_IDLE): {}",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(not(target_os = "linux"))]
pub fn enter_idle_class() -> Result<(), String> {
    Err("cpu_class idle is Linux's SCHED_IDLE, which this system does not have".into())
}

/// Opts the calling process out of transparent huge pages (Linux's
/// `PR_SET_THP_DISABLE`, since 3.15): memory it maps from now on is backed 4 KiB at a
/// time, whatever `/sys/kernel/mm/transparent_hugepage/enabled` says. The setting is
/// the whole process's and is kept across `fork` and `execve`; huge pages already
/// mapped stay, so it is called before the runtime and the store allocate.
#[cfg(target_os = "linux")]
pub fn disable_transparent_huge_pages() -> Result<(), String> {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and writes no memory of
    // this process; the unused arguments are zero as prctl(2) asks.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot opt out of transparent huge pages (prctl PR_SET_THP_DISABLE): {}",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(not(target_os = "linux"))]
pub fn disable_transparent_huge_pages() -> Result<(), String> {
    // Transparent huge pages are Linux's: elsewhere there is nothing to opt out of.
    Ok(())
}

/// Restores SIGPIPE's default action (end the process quietly), which Rust's runtime
/// sets to ignored: a client command whose output goes to a reader that stopped early
/// (`hawser sql ... | head`) then ends as other Unix tools do, instead of failing (or,
/// where it prints with `println!`, panicking) on the write. Sockets are unaffected: Rust writes to them with MSG_NOSIGNAL, so
/// a peer that goes away is still an error the command reports. Not for a node, which
/// must outlive any one reader of anything.
#[cfg(unix)]
pub fn default_sigpipe() {
    // SAFETY: setting a standard signal's disposition to SIG_DFL installs no handler
    // (no code of ours runs in signal context) and is done before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
pub fn default_sigpipe() {}
