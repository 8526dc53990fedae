//! End to end: real TCP/UDP from a client namespace through the real XDP program, attached
//! and configured by the real `lbd` through the real `lbctl`, to backends that decapsulate
//! with `lbd agent`. Every scenario runs in native and in generic XDP mode. Needs root.

mod affinity;
mod agents;
mod beside;
mod config_file;
mod flood;
mod fragments;
mod gue;
mod health;
mod health_policy;
mod health_state;
mod hitless_restart;
mod hostile;
mod input;
mod instances;
mod membership;
mod observability;
mod overload;
mod packet_too_big;
mod ping;
mod port_pressure;
mod quic;
mod reachability;
mod support;
mod table_full;
mod tx_drops;
mod uplinks;
mod vip_path;

/// Runs scenario `$name(mode)` once per XDP mode.
#[macro_export]
macro_rules! in_both_modes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn native() {
                super::$name(spillway_harness::cluster::XdpMode::Native);
            }

            #[test]
            fn generic() {
                super::$name(spillway_harness::cluster::XdpMode::Generic);
            }
        }
    };
}
