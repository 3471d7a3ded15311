//! Which process a role is (docs/design.md 3.12), from the best source there is: the
//! engine's self-report (`pid`/`started_at`, vLLM's start time), llama-server's
//! `Process-Start-Time-Unix` header on `/metrics`, or, for a role on this host, the
//! process listening on its health port, found as `ss -ltnp` finds it: the socket's
//! inode in `/proc/net/tcp{,6}`, the process holding it in `/proc/<pid>/fd`, its start
//! time in `/proc/<pid>/stat`. A start time outranks a pid alone (a restarted
//! container's engine can get its pid back); a role none of these name is said to be
//! unidentified, never assumed the same.

use std::path::Path;

use crate::config::RoleSpec;
use crate::core::effective::{reported_identity, Identity, IdentitySource};

/// The header llama-server sets on its `/metrics` reply: the process's start, Unix
/// seconds.
const START_HEADER: &str = "Process-Start-Time-Unix";

/// The role's identity now: every source that answers, the best named as its source
/// (a self-report with a start time, llama-server's header, the listening socket, a
/// self-reported pid alone). `report` is its self-report when one was just read (else
/// it is asked for).
pub(crate) async fn identify(
    http: &reqwest::Client,
    role: &RoleSpec,
    api_key: Option<&str>,
    report: Option<&serde_json::Value>,
) -> Identity {
    let asked;
    let report = match report {
        Some(doc) => Some(doc),
        None => {
            asked = super::fetch_server_info(http, role, api_key).await;
            asked.as_ref()
        }
    };
    let mut identity = report
        .and_then(reported_identity)
        .unwrap_or_else(Identity::unknown);
    if identity.started.is_none() {
        if let Some(started) = metrics_start_time(http, role, api_key).await {
            identity.started = Some(started);
            identity.source = IdentitySource::MetricsHeader;
        }
    }
    identity.listener = local_listener(&role.health);
    if identity.started.is_none() && identity.listener.is_some() {
        identity.source = IdentitySource::ListeningSocket;
    }
    identity
}

/// llama-server's start time from its `/metrics` reply's header, where it sets one.
async fn metrics_start_time(
    http: &reqwest::Client,
    role: &RoleSpec,
    api_key: Option<&str>,
) -> Option<String> {
    let url = role.metrics.as_ref()?;
    let mut request = http.get(url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.ok()?;
    let value = response.headers().get(START_HEADER)?.to_str().ok()?;
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// `url`'s port, when its host is this one (a loopback address or `localhost`).
fn local_port(url: &str) -> Option<u16> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let local = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip.is_unspecified(),
        Err(_) => host == "localhost",
    };
    local.then(|| parsed.port_or_known_default()).flatten()
}

/// Whether a socket listens on `url`'s port on this host, answering or not (an engine
/// still exiting holds its port closed to a new one without answering on it): who holds
/// it (`pid P started T`, or that this user cannot see), `None` when nothing does or the
/// host is another.
pub(crate) fn port_held(url: &str) -> Option<String> {
    let port = local_port(url)?;
    let proc_root = Path::new("/proc");
    let inodes = listening_inodes(proc_root, port);
    if inodes.is_empty() {
        return None;
    }
    Some(local_listener(url).unwrap_or_else(|| "a process this user cannot see".into()))
}

/// Connections on `url`'s port on this host (its local end) that a stopped engine closed
/// and the other end has not yet acknowledged: FIN_WAIT1, CLOSING, LAST_ACK. While one
/// lingers, a server that binds with SO_REUSEPORT alone (llama-server's cpp-httplib)
/// cannot bind the port: measured between a 0.3.8 llama-server aborted with connections
/// open and the 0.3.36 one started after it. `None` for another host.
pub(crate) fn port_unsettled(url: &str) -> Option<usize> {
    let port = local_port(url)?;
    Some(
        tcp_tables(Path::new("/proc"))
            .map(|t| count_unsettled(&t, port))
            .sum(),
    )
}

/// Lines of a `/proc/net/tcp`-format table whose local port is `port` and whose state is
/// FIN_WAIT1 (`04`), LAST_ACK (`09`) or CLOSING (`0B`).
fn count_unsettled(table: &str, port: u16) -> usize {
    tcp_rows(table)
        .filter(|r| r.local == port && matches!(r.state, "04" | "09" | "0B"))
        .count()
}

/// Connections on this host with `url`'s port at either end in a closing state
/// (TIME_WAIT and the FIN/CLOSING/LAST_ACK states): what lingers after an engine on that
/// port stopped. `None` for another host.
pub(crate) fn port_lingering(url: &str) -> Option<usize> {
    let port = local_port(url)?;
    Some(
        tcp_tables(Path::new("/proc"))
            .map(|t| count_lingering(&t, port))
            .sum(),
    )
}

/// Lines of a `/proc/net/tcp`-format table with `port` at either end and state FIN_WAIT1
/// (`04`), FIN_WAIT2 (`05`), TIME_WAIT (`06`), LAST_ACK (`09`) or CLOSING (`0B`).
fn count_lingering(table: &str, port: u16) -> usize {
    tcp_rows(table)
        .filter(|r| {
            (r.local == port || r.remote == port)
                && matches!(r.state, "04" | "05" | "06" | "09" | "0B")
        })
        .count()
}

/// The text of this host's TCP tables, IPv4 and IPv6, those this user may read.
fn tcp_tables(proc_root: &Path) -> impl Iterator<Item = String> + '_ {
    ["net/tcp", "net/tcp6"]
        .into_iter()
        .filter_map(move |t| std::fs::read_to_string(proc_root.join(t)).ok())
}

/// One line of a `/proc/net/tcp`-format table: columns `sl`, `local_address`
/// (`ADDR:PORT`, port in hex), `rem_address`, `st`, ..., `inode` (the 10th).
struct TcpRow<'t> {
    local: u16,
    remote: u16,
    state: &'t str,
    inode: u64,
}

/// The rows of a table, its header skipped, lines that do not parse left out.
fn tcp_rows(table: &str) -> impl Iterator<Item = TcpRow<'_>> {
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).filter_map(move |line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        Some(TcpRow {
            local: port(cols.get(1)?)?,
            remote: port(cols.get(2)?)?,
            state: cols.get(3)?,
            inode: cols.get(9)?.parse().ok()?,
        })
    })
}

/// The process listening on the port of `url` on this host (the lowest pid holding the
/// socket), where there is one and `/proc` shows it.
pub(crate) fn listener_pid(url: &str) -> Option<u32> {
    let port = local_port(url)?;
    let proc_root = Path::new("/proc");
    owner_of(proc_root, &listening_inodes(proc_root, port))
}

/// The process listening on `url`'s port, when its host is this one (a loopback
/// address or `localhost`) and this user may read it: `pid P started T`.
pub(crate) fn local_listener(url: &str) -> Option<String> {
    let pid = listener_pid(url)?;
    let started = start_ticks(Path::new("/proc"), pid)?;
    Some(format!("pid {pid} started {started}"))
}

/// The inodes of the sockets listening on `port` (state `0A`, LISTEN), IPv4 and IPv6.
fn listening_inodes(proc_root: &Path, port: u16) -> Vec<u64> {
    tcp_tables(proc_root)
        .flat_map(|text| parse_listeners(&text, port))
        .collect()
}

/// The inodes of `/proc/net/tcp`-format lines listening on `port`: columns `sl`,
/// `local_address` (`ADDR:PORT`, port in hex), `rem_address`, `st`, ..., `inode` (10th).
fn parse_listeners(table: &str, port: u16) -> Vec<u64> {
    tcp_rows(table)
        .filter(|r| r.state == "0A" && r.local == port && r.inode != 0)
        .map(|r| r.inode)
        .collect()
}

/// The lowest pid holding one of `inodes` open (a forked server's children share its
/// socket; the lowest is the oldest, the one that bound it).
fn owner_of(proc_root: &Path, inodes: &[u64]) -> Option<u32> {
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut owners = Vec::new();
    for entry in std::fs::read_dir(proc_root).ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|target| target.to_str().map(|t| wanted.iter().any(|w| w == t)))
                .unwrap_or(false)
        });
        if holds {
            owners.push(pid);
        }
    }
    owners.into_iter().min()
}

/// A process's start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
fn start_ticks(proc_root: &Path, pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_start_ticks(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line; the command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_start_ticks(stat: &str) -> Option<String> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow; field 22 is the 20th of them.
    after.split_whitespace().nth(19).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_found_by_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
           1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n\
           2: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0\n";
        // 0x1F90 = 8080: the listener, not the established connection to it.
        assert_eq!(parse_listeners(table, 8080), vec![4242]);
        assert_eq!(parse_listeners(table, 8081), vec![4444]);
        assert!(parse_listeners(table, 9).is_empty());
    }

    #[test]
    fn the_start_time_is_field_22_after_a_command_name_with_spaces() {
        let stat = "1234 (llama (srv) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 9 0 987654 123456 789";
        assert_eq!(parse_start_ticks(stat).as_deref(), Some("987654"));
        assert_eq!(parse_start_ticks("garbage"), None);
    }

    #[test]
    fn this_process_is_found_listening_and_remote_hosts_are_not_looked_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let found = local_listener(&format!("http://127.0.0.1:{port}/health")).unwrap();
        assert!(
            found.starts_with(&format!("pid {} started ", std::process::id())),
            "{found}"
        );
        assert_eq!(local_listener("http://10.1.2.3:8080/health"), None);
        drop(listener);
        assert_eq!(
            local_listener(&format!("http://127.0.0.1:{port}/health")),
            None
        );
    }

    #[test]
    fn connections_the_engine_closed_unacknowledged_count_by_local_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F96 0100007F:A4F2 04 00000001:00000000 01:00000010 00000000     0        0 0\n\
   1: 0100007F:1F96 0100007F:A4F8 06 00000000:00000000 03:00000010 00000000     0        0 0\n\
   2: 0100007F:A4F2 0100007F:1F96 08 00000000:000006F0 00:00000000 00000000     0        0 1\n\
   3: 0100007F:1F96 0100007F:A500 0B 00000001:00000000 01:00000010 00000000     0        0 0\n\
   4: 0100007F:1F96 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7\n";
        // 0x1F96 = 8086: FIN_WAIT1 and CLOSING count; TIME_WAIT, the client's
        // CLOSE_WAIT (its local port is another) and the listener do not.
        assert_eq!(count_unsettled(table, 8086), 2);
        assert_eq!(count_unsettled(table, 8087), 0);
        // Lingering: either end (the client's TIME_WAIT to it counts), never the
        // listener nor an open CLOSE_WAIT.
        assert_eq!(count_lingering(table, 8086), 3);
        assert_eq!(count_lingering(table, 0xA4F8), 1);
        assert_eq!(port_unsettled("http://10.1.2.3:8086/health"), None);
    }

    #[test]
    fn a_port_is_held_while_a_socket_listens_on_it_answering_or_not() {
        // A listener that never accepts: what an exiting engine leaves for a moment.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://localhost:{}/health",
            listener.local_addr().unwrap().port()
        );
        let holder = port_held(&url).unwrap();
        assert!(
            holder.starts_with(&format!("pid {} ", std::process::id())),
            "{holder}"
        );
        drop(listener);
        assert_eq!(port_held(&url), None);
        assert_eq!(port_held("http://10.1.2.3:8080/health"), None);
    }
}
