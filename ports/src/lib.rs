//! Ephemeral-port exhaustion, watched per destination through the `sockwatch` eBPF object
//! (`sockwatch-ebpf/`): how many local ports each (network namespace, local address,
//! remote address, remote port, protocol) holds, against the namespace's
//! `ip_local_port_range`; which processes saw a call fail for want of a port (TCP
//! `connect()` with `EADDRNOTAVAIL`, `bind()` to port 0 with `EADDRINUSE`, UDP
//! `connect()` autobind with `EAGAIN`); and
//! which processes leak sockets in CLOSE_WAIT. `lbd agent` serves the report read-only over
//! HTTP ([`endpoint`]).
//!
//! Reading is cheap: the kernel keeps running TCP counts per destination, so a report walks
//! one small map (one entry per destination), never the TCP sockets. The live UDP sockets
//! and the sockets in CLOSE_WAIT are walked in the kernel (iterators over the maps that
//! track them), once per report: about 2 ms with 1,000 of them on the target.
//!
//! What is counted: TCP sockets from the active open (`SYN_SENT`) until they close, and
//! their TIME_WAIT successors for `TCP_TIMEWAIT_LEN` (60 s; the kernel reports no
//! TIME_WAIT end through a tracepoint, see `sockwatch-ebpf/sockwatch.bpf.c`). Passive
//! (accepted) sockets hold no ephemeral port and are not counted, but they are watched for
//! CLOSE_WAIT. A socket that `bind()`s an explicit port before `connect()` is counted too
//! (it also holds a port for that destination). UDP sockets holding a port that `bind()`
//! did not name (autobound by `connect()`/`sendto()`, or bound to port 0). Sockets
//! created before the watcher was loaded are not seen.

pub mod auth;
mod bpf;
mod cgroup;
mod diag;
pub mod endpoint;
mod error;
mod iter;
mod leaks;
mod maps;
mod mode;
mod range;
mod report;
mod snapshot;
mod sockdiag;
mod tracefs;
mod watcher;

pub use bpf::ProgramStats;
pub use error::PortsError;
pub use leaks::{Holder, leak_suspects, socket_owners};
pub use maps::{
    CALL_BIND, CALL_CONNECT, CloseWaitRecord, FailKey, PortCounts, PortKey, STAT_NAMES, TIMEWAIT_LEN_SECS, TW_BUCKETS, monotonic_secs,
};
pub use mode::WatcherMode;
pub use range::{NetnsResolver, netns_inode, read_netns_ports};
pub use report::build_report;
pub use snapshot::{Counts, Snapshot};
pub use watcher::{Scope, SockWatch, WatchOptions};
