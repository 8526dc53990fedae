//! Ephemeral-port exhaustion, watched per destination through the `sockwatch` eBPF object
//! (`sockwatch-ebpf/`): how many local ports each (network namespace, local address,
//! remote address, remote port, protocol) holds, against the namespace's
//! `ip_local_port_range`, and which processes saw `connect()` fail with `EADDRNOTAVAIL`.
//!
//! Reading is cheap: the kernel keeps running counts per destination, so a report walks
//! one small map (one entry per destination), never the sockets.
//!
//! What is counted: TCP sockets from the active open (`SYN_SENT`) until they close, and
//! their TIME_WAIT successors for `TCP_TIMEWAIT_LEN` (60 s; the kernel reports no
//! TIME_WAIT end through a tracepoint, see `sockwatch-ebpf/sockwatch.bpf.c`). Passive (accepted) sockets hold
//! no ephemeral port and are not counted. A socket that `bind()`s an explicit port before
//! `connect()` is counted too (it also holds a port for that destination).

mod maps;
mod range;
mod report;
mod watcher;

pub use maps::{FailKey, PortCounts, PortKey, STAT_NAMES, TIMEWAIT_LEN_SECS, TW_BUCKETS, monotonic_secs};
pub use range::{NetnsPorts, NetnsResolver, netns_inode, parse_port_list, read_netns_ports};
pub use report::{DestinationUsage, Dropped, Level, PortsReport, ProcessFailures, Thresholds, build_report};
pub use watcher::{PortsError, Snapshot, SockWatch};
