//! Test harness for Spillway: builds a network of namespaces (clients, the
//! balancer `lb`, backends `b1..`, joined by a bridge), runs processes in it
//! and drives real TCP/UDP traffic through it.
//!
//! ```text
//!   c1 10.0.0.11 ─┐                      ┌─ b1 10.0.0.101 (+ VIPs on lo)
//!   lb 10.0.0.2 ──┼── br0 (bridge netns) ┼─ b2 10.0.0.102
//!                 ...                    └─ ...
//! ```
//!
//! Clients route the VIPs (10.100.0.1, fd00:100::1) via `lb`; backends own
//! the VIPs and reply directly to clients (DSR). Everything is removed when
//! the [`Topology`] is dropped, also when a test panics; leftovers of killed
//! runs are swept by the next [`Topology::build`]. Needs root.

mod addrs;
pub mod alone;
mod bpf_link;
mod bpf_syscall;
pub mod bpffs;
mod capacity;
mod cleanup;
pub mod cluster;
mod cmd;
pub mod connects;
pub mod dashboard;
mod echo;
pub mod fleet;
mod flood;
pub mod frames;
mod host;
mod icmp;
mod lbctl;
mod load;
mod lock_file;
pub mod locked_kernel;
mod netns;
pub mod packet_lab;
mod process;
pub mod promql;
mod raw;
pub mod rng;
pub mod rps;
mod sandbox;
pub mod snippets;
pub mod soak;
mod stream;
pub mod support;
pub mod tempdir;
mod topology;
mod traffic;
pub mod unit;
pub mod uplinks;
mod xdp_pass;

pub use addrs::{
    LB4, LB6, MAX_BACKENDS, MAX_CLIENTS, MAX_FLEET_BALANCERS, ROUTER4, VIP4, VIP4_NET, VIP6, VIP6_NET, backend4, backend6, balancer4,
    client4, client6, edge_client4,
};
pub use capacity::{
    CAPACITY_BIN_ENV, CapacityStats, capacity_binary, capacity_stats, http_get, start_capacity_server, start_capacity_servers,
};
pub use cleanup::sweep_stale;
pub use echo::{ECHO_BIN_ENV, echo_binary, start_echo};
pub use flood::{ATTEMPT_TIMEOUT, FloodReport, flood};
pub use host::Host;
pub use icmp::ping;
pub use lbctl::{Lbctl, START_TIMEOUT, STOP_TIMEOUT};
pub use load::{Bucket, Load, LoadConfig, LoadReport, render_curve};
pub use netns::Netns;
pub use nix::sys::signal::Signal;
pub use process::{Daemon, harness_binary};
pub use raw::{Capture, send_frames, send_ip_packet};
pub use sandbox::Sandbox;
pub use stream::{CheckReport, Stream, StreamChecker};
pub use tempdir::TempDir;
pub use topology::{Topology, TopologyConfig};
pub use traffic::{Tally, run_connections, tcp_ask, udp_ask, udp_ask_with};

/// One test per port-watcher mode (btf, tracepoint, sock_diag), each running `$name(mode)`
/// with `spillway_model::ports_report::Mode` (resolved where the macro is used).
#[macro_export]
macro_rules! in_every_watcher_mode {
    ($name:ident) => {
        mod $name {
            use spillway_model::ports_report::Mode;

            #[test]
            fn btf() {
                super::$name(Mode::Btf);
            }

            #[test]
            fn tracepoint() {
                super::$name(Mode::Tracepoint);
            }

            #[test]
            fn sock_diag() {
                super::$name(Mode::SockDiag);
            }
        }
    };
}
