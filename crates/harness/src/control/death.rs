//! How a role's process ended, read without reaping it (docs/design.md 3.7, "Engine
//! deaths"): engine control holds the child (it waits for it when it stops the role), so
//! the death watch reads the kernel's record instead: a dead child stays a zombie until
//! waited for, and `/proc/<pid>/stat` then says `Z` and carries the status `waitpid`
//! would return (field 52, `exit_code`, Linux 3.5+). A role bisect did not spawn is dead
//! when its health port refuses connections (nothing listens there).

use std::path::Path;
use std::time::Duration;

use crate::core::deaths::ExitDesc;

/// How process `pid` ended, if it has: `None` while it runs. A process gone from
/// `/proc` altogether (reaped by someone) ended with an unknown status.
pub(crate) fn exit_of(pid: u32) -> Option<ExitDesc> {
    exit_in(Path::new("/proc"), pid)
}

fn exit_in(proc_root: &Path, pid: u32) -> Option<ExitDesc> {
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(stat) => parse_zombie(&stat),
        Err(_) => Some(ExitDesc {
            code: None,
            signal: None,
            signal_name: None,
        }),
    }
}

/// A `/proc/<pid>/stat` line's exit status once the process is dying or dead: its state
/// `Z` (a zombie: dead, not yet waited for) or `X`, or the `PF_EXITING` flag (0x4) in
/// its flags (field 9): the kernel sets that flag and the exit code at the start of
/// `do_exit`, before it closes the process's sockets, so a client that saw its
/// connection reset finds the process exiting here even before it is a zombie. Fields
/// are counted after the command name's last `)`: the state is the first (field 3),
/// `exit_code` the 50th (field 52).
fn parse_zombie(stat: &str) -> Option<ExitDesc> {
    const PF_EXITING: u64 = 0x4;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let state = *fields.first()?;
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if !matches!(state, "Z" | "X") && flags & PF_EXITING == 0 {
        return None;
    }
    let status: i32 = fields.get(49).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some(decode_status(status))
}

/// A `waitpid` status: killed by signal `status & 0x7f`, else exited with `status >> 8`;
/// a shell's exit code 128+N (a script that ran the engine without `exec`) reports
/// signal N.
pub(crate) fn decode_status(status: i32) -> ExitDesc {
    let name = |signal: i32| {
        nix::sys::signal::Signal::try_from(signal)
            .ok()
            .map(|s| s.as_str().to_string())
    };
    let signal = status & 0x7f;
    if signal != 0 {
        return ExitDesc {
            code: None,
            signal: Some(signal),
            signal_name: name(signal),
        };
    }
    let code = (status >> 8) & 0xff;
    let reported = (129..=128 + 64).contains(&code).then_some(code - 128);
    ExitDesc {
        code: Some(code),
        signal: reported,
        signal_name: reported.and_then(name),
    }
}

/// Whether `url`'s host refuses a TCP connection on its port now: nothing listens there
/// (a timeout or any other error is not a death: a busy engine may be slow to accept).
pub async fn refuses(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return false;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    matches!(
        tokio::time::timeout(Duration::from_secs(1), connect).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_says_how_it_died() {
        let zombie = |status: i32| {
            let mut fields = vec!["0"; 50];
            fields[0] = "Z";
            let status = status.to_string();
            fields[49] = &status;
            format!("4242 (llama (srv)) {}", fields.join(" "))
        };
        let segv = parse_zombie(&zombie(11 | 0x80)).unwrap();
        assert_eq!(
            (segv.signal, segv.signal_name.as_deref(), segv.code),
            (Some(11), Some("SIGSEGV"), None)
        );
        let shell = parse_zombie(&zombie(139 << 8)).unwrap();
        assert_eq!(shell.describe(), "exit 139 (the shell's report of SIGSEGV)");
        let plain = parse_zombie(&zombie(1 << 8)).unwrap();
        assert_eq!(plain.describe(), "exit 1");
        assert_eq!(parse_zombie("4242 (x) S 1 2 3"), None);
        // Still running its exit (PF_EXITING in the flags, field 9): already dying.
        let mut exiting = vec!["0"; 50];
        exiting[0] = "R";
        exiting[6] = "4194564";
        exiting[49] = "11";
        let line = format!("4242 (srv) {}", exiting.join(" "));
        assert_eq!(
            parse_zombie(&line).unwrap().signal_name.as_deref(),
            Some("SIGSEGV")
        );
    }

    #[test]
    fn a_child_killed_by_sigsegv_is_read_as_such_before_it_is_waited_for() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "kill -SEGV $$"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut found = None;
        for _ in 0..200 {
            found = exit_of(pid);
            if found.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let found = found.expect("the child died");
        assert_eq!(found.signal_name.as_deref(), Some("SIGSEGV"), "{found:?}");
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(11));
        assert_eq!(exit_of(std::process::id()), None, "this process runs");
    }

    #[tokio::test]
    async fn a_port_nothing_listens_on_refuses() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/health");
        assert!(!refuses(&url).await);
        drop(listener);
        assert!(refuses(&url).await);
    }
}
