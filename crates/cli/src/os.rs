//! Process settings the C library has and the Rust crates hawser uses do not wrap
//! safely: the CPU scheduling class a node runs in (`hawser start --cpu-class`), its
//! opting out of transparent huge pages (`--transparent-huge-pages`), and ending a
//! client command by SIGPIPE when its reader goes.
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

/// Makes a client command whose output goes to a reader that stopped early (`hawser
/// sql ... | head`) end as other Unix tools do — killed by SIGPIPE, quietly — instead of
/// panicking in `println!`. SIGPIPE itself stays ignored, as Rust's runtime sets it:
/// the command's sockets are written with `writev` too, which raises SIGPIPE when a
/// node it talks to has gone, and a drill or a bench must report that node's death,
/// not die of it without a word.
pub fn end_quietly_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            die_of_sigpipe();
        }
        default(info);
    }));
}

/// Whether `e` is a write to standard output whose reader went away: an I/O error of
/// kind BrokenPipe at the root, and standard output a pipe with no reader now. A
/// socket's broken pipe has the same root (a node that dropped the connection, such as
/// a secure node a plain client reached) and must be reported, not swallowed.
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        && stdout_reader_gone()
}

#[cfg(unix)]
fn stdout_reader_gone() -> bool {
    reader_gone(libc::STDOUT_FILENO)
}

/// Whether `fd` is the write end of a pipe whose read end is closed (poll says POLLERR).
#[cfg(unix)]
fn reader_gone(fd: libc::c_int) -> bool {
    let mut fd = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call's duration, and a zero timeout.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready == 1 && fd.revents & libc::POLLERR != 0
}

#[cfg(not(unix))]
fn stdout_reader_gone() -> bool {
    true
}

/// Ends the process as SIGPIPE's default action does.
#[cfg(unix)]
pub fn die_of_sigpipe() -> ! {
    // SAFETY: setting a standard signal's disposition to SIG_DFL installs no handler
    // (no code of ours runs in signal context), and raising it ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

#[cfg(not(unix))]
pub fn die_of_sigpipe() -> ! {
    std::process::exit(141)
}

#[cfg(all(test, unix))]
mod tests {
    use super::reader_gone;

    #[test]
    fn a_pipe_is_closed_only_once_its_reader_is_gone() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (read, write) = (fds[0], fds[1]);
        assert!(!reader_gone(write));
        // SAFETY: `read` is ours and closed once.
        unsafe { libc::close(read) };
        assert!(reader_gone(write));
        // SAFETY: `write` is ours and closed once.
        unsafe { libc::close(write) };
    }
}
