//! Frames lost on the way out of the balancer's interface. XDP_TX and redirects hand frames
//! to the driver after the data path has counted them as sent; a driver that cannot take
//! them (a veth whose peer runs no XDP program, a full TX ring) drops them and says so only
//! in the interface's `tx_dropped` counter. Probes leave through the kernel's stack, so
//! health checks stay green while every client packet is lost: this turns the counter's
//! growth into an ALERT.

use std::time::{Duration, Instant};

/// How long the counter must stand still before the alert clears.
pub const QUIET: Duration = Duration::from_secs(30);

/// What the operator should do, by the interface's driver kind.
pub fn advice(kind: Option<&str>) -> &'static str {
    match kind {
        Some("veth") => {
            "a veth drops XDP_TX and redirected frames unless its peer runs an XDP program: attach one there \
             (even XDP_PASS), or run lbd with --xdp-mode generic"
        }
        _ => "the driver could not send them (TX ring full, no native XDP_TX support): see ethtool -S and the README",
    }
}

/// The `tx_dropped` readings of one interface, and the alert they raise.
#[derive(Debug, Default)]
pub struct TxDrops {
    last: Option<u64>,
    /// Drops since the alert was raised, and when the counter last grew.
    alerting: Option<(u64, Instant)>,
}

impl TxDrops {
    /// Takes a reading; returns the alert in force (`None`: no drops for [`QUIET`]).
    pub fn observe(&mut self, tx_dropped: u64, now: Instant) -> Option<u64> {
        let grown = self.last.map_or(0, |last| tx_dropped.saturating_sub(last));
        self.last = Some(tx_dropped);
        self.alerting = match self.alerting {
            _ if grown > 0 => Some((self.alerting.map_or(0, |(n, _)| n) + grown, now)),
            Some((_, since)) if now.duration_since(since) >= QUIET => None,
            other => other,
        };
        self.alerting.map(|(n, _)| n)
    }
}

/// The alert line for `dropped` frames on `iface`.
pub fn alert(iface: &str, dropped: u64, kind: Option<&str>) -> String {
    format!(
        "ALERT: {iface} dropped {dropped} frames on the way out (tx_dropped): packets the balancer sent may never have left; {}",
        advice(kind)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_raises_the_alert_and_a_quiet_counter_clears_it() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut drops = TxDrops::default();
        assert_eq!(drops.observe(7, at(0)), None, "the first reading is the baseline, drops before lbd included");
        assert_eq!(drops.observe(7, at(2)), None);
        assert_eq!(drops.observe(19, at(4)), Some(12));
        assert_eq!(drops.observe(20, at(6)), Some(13), "counts add up while it lasts");
        assert_eq!(drops.observe(20, at(6 + QUIET.as_secs() - 1)), Some(13), "still within the quiet time");
        assert_eq!(drops.observe(20, at(6 + QUIET.as_secs())), None, "cleared");
        assert_eq!(drops.observe(21, at(40)), Some(1), "raised again from zero");
        assert_eq!(drops.observe(3, at(42)), Some(1), "a reset counter (device recreated) is no growth");
    }

    #[test]
    fn the_alert_says_what_to_do_on_a_veth() {
        let line = alert("eth0", 12, Some("veth"));
        assert!(line.starts_with("ALERT: eth0 dropped 12 frames") && line.contains("its peer runs an XDP program"), "{line}");
        assert!(alert("eth0", 1, None).contains("ethtool -S"));
    }
}
