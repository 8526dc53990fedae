//! The closed-loop load and `spillway-http` against each other, with no balancer in between:
//! every request is answered on its own connection, each counted once with its time, and a
//! request to a closed port counts as failed. Needs root. Nothing here is timed.

use std::net::SocketAddr;
use std::time::Duration;

use spillway_harness::rps::{ClosedLoopConfig, closed_loop, start_http_server};
use spillway_harness::{Topology, TopologyConfig};

const PORT: u16 = 8080;

#[test]
fn every_request_is_answered_on_its_own_connection_and_counted_once() {
    let topo = Topology::build(TopologyConfig { backends: 1, clients: 2 }).unwrap();
    let backend = &topo.backends()[0];
    let _server = start_http_server(backend, PORT, 2).unwrap();
    let clients: Vec<_> = topo.clients().iter().collect();
    let config = |port| ClosedLoopConfig {
        target: SocketAddr::new(backend.ipv4().into(), port),
        concurrency: 4,
        duration: Duration::from_millis(500),
        timeout: Duration::from_secs(2),
    };

    let report = closed_loop(&clients, config(PORT)).unwrap();
    assert!(report.ok > 0 && report.failed == 0, "{report:?}");
    assert_eq!(report.latencies.len() as u64, report.ok);
    assert!(report.latencies.is_sorted());
    assert!(report.percentile(50.0) <= report.percentile(99.0));
    // A new connection each: the client keeps none, in TIME_WAIT or otherwise.
    for client in &clients {
        let sockets = client.run(&["ss", "-tanH", "state", "all", "dport", &PORT.to_string()]).unwrap();
        assert!(sockets.trim().is_empty(), "{} kept sockets:\n{sockets}", client.name());
    }

    let refused = closed_loop(&clients, config(PORT + 1)).unwrap();
    assert!(refused.ok == 0 && refused.failed > 0, "{refused:?}");
    assert!(refused.errors.iter().all(|e| e.contains("connect")), "{:?}", refused.errors);
}
