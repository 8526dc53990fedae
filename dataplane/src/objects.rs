//! The eBPF objects, embedded at build time (see build.rs).

use aya::include_bytes_aligned;

/// The balancer (`spillway_lb`) and its maps.
pub static BALANCER: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-lb"));
/// The backend-side decapsulator (`spillway_decap`).
pub static DECAP: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-decap"));
/// The benchmark floor (`spillway_floor`): returns XDP_TX.
pub static FLOOR: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-floor"));
/// Bench only: the cheapest XDP hop to the backends (`spillway_hop`; see its source).
pub static HOP: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-hop"));
/// Bench only: the balancer cut short after each stage (`lb_to_*`), and whole (`lb_all`).
pub static BALANCER_STAGES: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-lb-stages"));
/// Never loaded by `lbd`: an operator's root program (`operator_root`) and filter
/// (`operator_count`), for the tests of running beside other XDP programs.
pub static OPERATOR_EXAMPLE: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-operator-example"));
/// The socket/port watcher (`sockwatch-ebpf/`, C with CO-RE; see `spillway_ports`).
pub static SOCKWATCH: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spillway-sockwatch"));
