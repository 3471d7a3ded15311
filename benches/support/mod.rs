//! What the client benches (`driver`, `floor`) read off their own process the same way,
//! so their rows in `scripts/bench-clients.sh`'s table compare like with like.

/// A `/proc/self/status` field in KiB (`VmHWM:`: peak RSS).
pub fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The `q` quantile (nearest rank) of sorted nanoseconds, in milliseconds; 0 when empty.
pub fn percentile_ms(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_ns.len() as f64).ceil() as usize).clamp(1, sorted_ns.len());
    sorted_ns[rank - 1] as f64 / 1e6
}

/// User + system CPU seconds of this process, all threads, to the microsecond
/// (getrusage(RUSAGE_SELF)); 0 if it cannot be read.
pub fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0.0;
    };
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}
