//! Faults a drill injects into this node (`Admin.Fault`, `hawser drill`): a crash, as
//! SIGKILL would make it, with a restart after a down time, and a pause, as SIGSTOP
//! would make it.
//!
//! ```text
//!  Admin.Fault(node_id, kind, down) ─► checked (allowed here? this node's id?) ─► reply
//!   └─ ~100 ms later, on a thread of its own:
//!      crash, down 0:   SIGKILL to this process (a supervisor restarts it, or nobody)
//!      crash, down > 0: exec `<this binary> internal-restart --after-ms D -- <argv>`:
//!                       every thread, socket and buffer of the node is gone at once,
//!                       as in a crash; D later that program execs the node again,
//!                       same pid, same data, same arguments
//!      pause:           spawn `<this binary> internal-resume --pid P --after-ms D`,
//!                       then SIGSTOP to this process; the helper sends SIGCONT
//! ```
//!
//! Both work the same in a Kubernetes pod as on a laptop: nothing outside the process is
//! needed. The binary that embeds the node must answer the two `internal-…`
//! subcommands with [`restart_after`] and [`resume_after`] (hawser's does).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The longest down time a fault takes: a drill is about seconds, and a typo in
/// milliseconds should not keep a node away for a day.
pub const MAX_DOWN: Duration = Duration::from_secs(600);

/// How long after its reply a fault strikes: time for the reply to leave.
const REPLY_GRACE: Duration = Duration::from_millis(100);

/// A fault, as asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Stop at once; start again after the down time (`None`: stay down).
    Crash { restart_after: Option<Duration> },
    /// Stop every thread for this long.
    Pause(Duration),
    /// Neither send nor take peer traffic for this long, while clients still reach
    /// the node ([`hawser_core::isolation`]).
    Isolate(Duration),
}

impl Fault {
    /// The fault `kind` with `down_ms`, or why it is not one.
    pub fn parse(kind: &str, down_ms: u64) -> Result<Fault, String> {
        let down = Duration::from_millis(down_ms);
        if down > MAX_DOWN {
            return Err(format!(
                "down time {down:?} is longer than the {MAX_DOWN:?} a fault may take"
            ));
        }
        match kind.trim().to_ascii_lowercase().as_str() {
            "crash" => Ok(Fault::Crash {
                restart_after: (down_ms > 0).then_some(down),
            }),
            "pause" if down_ms > 0 => Ok(Fault::Pause(down)),
            "isolate" if down_ms > 0 => Ok(Fault::Isolate(down)),
            k @ ("pause" | "isolate") => Err(format!("{k} needs a down time above 0")),
            other => Err(format!(
                "unknown fault kind {other:?}: crash, pause or isolate"
            )),
        }
    }

    /// What the node will do, in words, for the reply.
    pub fn describe(&self) -> String {
        match self {
            Fault::Crash {
                restart_after: Some(d),
            } => format!("crashing now; starting again on the same data in {d:?}"),
            Fault::Crash {
                restart_after: None,
            } => "crashing now (SIGKILL); it stays down until its supervisor restarts it".into(),
            Fault::Pause(d) => format!("pausing every thread (SIGSTOP) for {d:?}"),
            Fault::Isolate(d) => format!(
                "cut off from every peer for {d:?} (no Raft, reports or streams; clients \
                 still reach it)"
            ),
        }
    }
}

/// The arguments `internal-restart` is run with to bring back a node whose own
/// arguments (without the program name) are `node_args`, on the addresses it had bound
/// (`listen`, `http`): a node started on port 0 must come back where the cluster knows
/// it, so those flags are set to them (replaced where given, added where not; a flag
/// outranks the environment and the config file).
pub fn restart_args(
    after: Duration,
    node_args: &[OsString],
    listen: SocketAddr,
    http: SocketAddr,
) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        "internal-restart".into(),
        "--after-ms".into(),
        after.as_millis().to_string().into(),
        "--".into(),
    ];
    let bound = |flag: &str| match flag {
        "--listen" => Some(listen.to_string()),
        "--http" => Some(http.to_string()),
        _ => None,
    };
    let (mut listen_set, mut http_set) = (false, false);
    let mut args = node_args.iter();
    while let Some(a) = args.next() {
        let text = a.to_string_lossy();
        let (flag, inline) = match text.split_once('=') {
            Some((f, _)) if f.starts_with("--") => (f.to_string(), true),
            _ => (text.to_string(), false),
        };
        match bound(&flag) {
            Some(addr) => {
                listen_set |= flag == "--listen";
                http_set |= flag == "--http";
                if !inline {
                    args.next();
                }
                out.push(flag.into());
                out.push(addr.into());
            }
            None => out.push(a.clone()),
        }
    }
    if !listen_set {
        out.extend(["--listen".into(), listen.to_string().into()]);
    }
    if !http_set {
        out.extend(["--http".into(), http.to_string().into()]);
    }
    out
}

/// Strikes `fault` on a thread of its own, [`REPLY_GRACE`] from now; a crash comes
/// back on the addresses the node had bound (`listen`, `http`).
pub fn inject(fault: Fault, listen: SocketAddr, http: SocketAddr) {
    std::thread::spawn(move || {
        std::thread::sleep(REPLY_GRACE);
        strike(fault, listen, http);
    });
}

fn strike(fault: Fault, listen: SocketAddr, http: SocketAddr) {
    let me = Pid::this();
    match fault {
        Fault::Isolate(d) => hawser_core::isolation::isolate_for(d),
        Fault::Crash {
            restart_after: Some(after),
        } => {
            let node_args: Vec<OsString> = std::env::args_os().skip(1).collect();
            let err = match std::env::current_exe() {
                Ok(exe) => Command::new(exe)
                    .args(restart_args(after, &node_args, listen, http))
                    .exec(),
                Err(e) => e,
            };
            // Still here: the exec failed. Crash all the same; a supervisor may bring
            // the node back.
            tracing::error!(error = %err, "cannot run the restart of a drill's crash; killing the process");
            let _ = kill(me, Signal::SIGKILL);
        }
        Fault::Crash {
            restart_after: None,
        } => {
            let _ = kill(me, Signal::SIGKILL);
        }
        Fault::Pause(down) => {
            let helper = std::env::current_exe().and_then(|exe| {
                Command::new(exe)
                    .args([
                        "internal-resume".to_string(),
                        "--pid".to_string(),
                        me.as_raw().to_string(),
                        "--after-ms".to_string(),
                        down.as_millis().to_string(),
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
            });
            match helper {
                Ok(mut child) => {
                    if let Err(e) = kill(me, Signal::SIGSTOP) {
                        tracing::error!(error = %e, "cannot pause the process");
                    }
                    // Continued: reap the helper.
                    let _ = child.wait();
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the helper that would resume the process; not pausing");
                }
            }
        }
    }
}

/// `internal-restart`: waits `after`, then becomes the node again (`exe node_args`).
/// Returns only if that exec fails.
pub fn restart_after(after: Duration, node_args: &[OsString]) -> std::io::Error {
    std::thread::sleep(after);
    match std::env::current_exe() {
        Ok(exe) => Command::new(exe).args(node_args).exec(),
        Err(e) => e,
    }
}

/// `internal-resume`: waits `after`, then continues process `pid`.
pub fn resume_after(pid: i32, after: Duration) -> Result<(), String> {
    std::thread::sleep(after);
    kill(Pid::from_raw(pid), Signal::SIGCONT)
        .map_err(|e| format!("cannot continue process {pid}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_a_crash_or_a_pause_with_a_bounded_down_time() {
        assert_eq!(
            Fault::parse("crash", 0),
            Ok(Fault::Crash {
                restart_after: None
            })
        );
        assert_eq!(
            Fault::parse(" CRASH ", 1500),
            Ok(Fault::Crash {
                restart_after: Some(Duration::from_millis(1500))
            })
        );
        assert_eq!(
            Fault::parse("pause", 800),
            Ok(Fault::Pause(Duration::from_millis(800)))
        );
        assert!(Fault::parse("pause", 0).unwrap_err().contains("above 0"));
        assert_eq!(
            Fault::parse("isolate", 10),
            Ok(Fault::Isolate(Duration::from_millis(10)))
        );
        assert!(Fault::parse("isolate", 0)
            .unwrap_err()
            .contains("isolate needs a down time"));
        assert!(Fault::parse("partition", 10)
            .unwrap_err()
            .contains("crash, pause or isolate"));
        assert!(Fault::parse("crash", 601_000)
            .unwrap_err()
            .contains("longer"));
    }

    #[test]
    fn a_crash_restarts_the_node_with_its_own_arguments_on_its_bound_addresses() {
        let listen: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let http: SocketAddr = "127.0.0.1:41235".parse().unwrap();
        let run = |args: &[&str]| -> Vec<String> {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            restart_args(Duration::from_millis(2500), &args, listen, http)
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            run(&[
                "start",
                "--name",
                "n1",
                "--listen",
                "127.0.0.1:0",
                "--http=127.0.0.1:0",
                "--allow-faults"
            ]),
            [
                "internal-restart",
                "--after-ms",
                "2500",
                "--",
                "start",
                "--name",
                "n1",
                "--listen",
                "127.0.0.1:41234",
                "--http",
                "127.0.0.1:41235",
                "--allow-faults"
            ]
        );
        // Not given (config file or environment): added, which outranks both.
        assert_eq!(
            run(&["start", "--config", "n.toml"])[4..],
            [
                "start",
                "--config",
                "n.toml",
                "--listen",
                "127.0.0.1:41234",
                "--http",
                "127.0.0.1:41235"
            ]
        );
    }
}
