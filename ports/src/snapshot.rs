//! What one read of the watcher holds: per destination counts, UDP sockets, failures and
//! sockets in CLOSE_WAIT, whichever mode took it.

use super::maps::{CloseWaitRecord, FailKey, PortCounts, PortKey, STAT_NAMES};

/// One destination's counts when a snapshot was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// TCP sockets holding a port for this destination (SYN_SENT until CLOSE; negative
    /// only if an open was missed).
    pub active: i64,
    /// TIME_WAIT sockets holding a port (BPF modes: created in the last 60 s, an upper
    /// bound; sock_diag: exact).
    pub time_wait: u64,
    /// Cumulative since load, BPF modes only ([`parts::OPENS`]): TIME_WAIT entries,
    /// active opens.
    pub time_wait_total: u64,
    pub opened: u64,
    /// Cumulative calls that failed for want of a port (BPF modes).
    pub failures: u64,
}

impl PortCounts {
    /// The counts at monotonic second `now`.
    pub fn at(&self, now: u32) -> Counts {
        Counts {
            active: self.active,
            time_wait: self.time_wait_at(now),
            time_wait_total: self.time_wait_total,
            opened: self.opened,
            failures: self.failures,
        }
    }
}

/// One read of what the watcher sees, in its scope.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per destination key: TCP counts (UDP keys carry only failures).
    pub destinations: Vec<(PortKey, Counts)>,
    /// Per destination key, the UDP sockets holding an ephemeral port.
    pub udp: Vec<(PortKey, u64)>,
    /// Per (destination, process), calls failed for lack of a port.
    pub failures: Vec<(FailKey, u64)>,
    /// Every socket in CLOSE_WAIT (BPF modes: created since the watcher loaded).
    pub close_wait: Vec<CloseWaitRecord>,
    /// See [`STAT_NAMES`] (BPF modes).
    pub stats: [u64; STAT_NAMES.len()],
    /// Monotonic seconds when the snapshot was taken.
    pub now: u32,
}

impl Snapshot {
    /// The counts of destination `key` (all zero if not seen).
    pub fn counts(&self, key: &PortKey) -> Counts {
        self.destinations.iter().find(|(k, _)| k == key).map(|(_, c)| *c).unwrap_or_default()
    }

    /// The UDP sockets holding an ephemeral port towards `key`.
    pub fn udp_count(&self, key: &PortKey) -> u64 {
        self.udp.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n)
    }

    pub(super) fn retain_netns(&mut self, netns: u32) {
        self.destinations.retain(|(k, _)| k.netns == netns);
        self.udp.retain(|(k, _)| k.netns == netns);
        self.failures.retain(|(f, _)| f.key.netns == netns);
        self.close_wait.retain(|r| r.key.netns == netns);
    }
}
