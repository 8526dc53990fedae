//! Prometheus metrics: a `Sample` of the balancer (or a `PortsReport` of a backend host)
//! in, OpenMetrics text out ([`balancer`], [`ports`]), with the classic text format beside
//! it for clients that do not ask for OpenMetrics (curl, `promtool check metrics`); the HTTP
//! listener that serves them is [`listener`]. Nothing here reads a map or holds a lock: the
//! daemon takes the sample.
//!
//! Conventions: every name starts with `spillway_`, counters end in `_total`, sizes are in
//! bytes and times in seconds, and one metric per meaning with labels for its dimensions.
//! Label values are bounded by configuration, never by traffic:
//!
//! | label | values | bound |
//! |---|---|---|
//! | `vip` | configured VIPs (`10.0.0.1:80/tcp`) | `MAX_VIPS` (64) |
//! | `prefix` | announced VIP addresses (`10.0.0.1/32`) | `MAX_VIPS` (64) |
//! | `backend` | a VIP's backends (address) | `MAX_BACKENDS` (4096) over all VIPs |
//! | `reason`, `action` | the data path's `Reason`s | 16 |
//! | `cidr`, `vip`, `action`, `observe` of rules | configured rules | `MAX_RULES` (1024) |
//! | `state`, `level`, `outcome`, `op`, `map` | fixed sets | < 20 each |
//! | `protocol`, `local`, `remote`, `remote_port` (agent) | the worst destinations only | [`ports::WORST_DESTINATIONS`] |
//!
//! Client addresses never appear: per-source figures stay in `lbctl top-sources`.
//! Announcements (BGP through BIRD) are part of [`balancer`]'s output when `lbd` announces.

mod balancer;
mod family;
pub mod listener;
pub mod ports;

pub use balancer::balancer;
pub use listener::{Limits, MetricsListen, Serving, serve, spawn};
pub use ports::{agent, ports};

/// `lbd --metrics-listen`'s default: local only (a local Prometheus or agent scrapes it).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9476";
/// `lbd agent --metrics-listen`'s default.
pub const DEFAULT_AGENT_LISTEN: &str = "127.0.0.1:9478";
/// The one path served.
pub const PATH: &str = "/metrics";
/// The two bodies: OpenMetrics for scrapers that accept it (Prometheus does), the classic
/// text format otherwise.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One scrape's families in both formats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exposition {
    pub openmetrics: String,
    pub text: String,
}

#[cfg(test)]
mod tests;
