//! A hostile host against `lbd`'s port-pressure polls: with the agent gone, whoever binds
//! its port answers `lbd`'s polls. A report `lbd` cannot authenticate (here: an unsigned
//! one claiming every port is taken) moves no weight and is an ALERT in `lbctl backends list`.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use spillway_harness::cluster::XdpMode;
use spillway_model::ports_report::{DestinationUsage, Dropped, Level, PortsReport, Thresholds};

use crate::support::*;

/// A report claiming a destination at 99% of its ports with connects failing.
fn exhausted(backend: IpAddr, failures: u64) -> Vec<u8> {
    let report = PortsReport {
        thresholds: Thresholds::default(),
        destinations: vec![DestinationUsage {
            netns: 1,
            protocol: "tcp".into(),
            local: backend,
            remote: IpAddr::from([10, 9, 9, 9]),
            remote_port: 5432,
            active: 99,
            time_wait: 0,
            in_use: 99,
            failures,
            opened: 99,
            port_range: None,
            usable_ports: Some(100),
            utilisation: Some(0.99),
            level: Level::Critical,
        }],
        failures: Vec::new(),
        leak_suspects: Vec::new(),
        watcher: None,
        dropped: Dropped::default(),
    };
    serde_json::to_vec(&report).unwrap()
}

#[test]
fn an_impostor_on_the_agents_port_moves_no_weight() {
    let c = start(XdpMode::Generic, 2);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let b1 = &c.topo.backends()[0];
    let b1_addr = b1.ipv4().to_string();
    // The agent stops (its decapsulation goes on through the pinned link); an unprivileged
    // user of b1 takes its port and answers every poll with exhaustion.
    c.stop_agent(0).unwrap();
    let impostor = b1.in_netns(|| TcpListener::bind("0.0.0.0:9477").unwrap());
    let backend = IpAddr::from(b1.ipv4());
    std::thread::spawn(move || {
        for (n, stream) in impostor.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let body = exhausted(backend, n as u64 + 1);
            let _ = stream.write_all(format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    let alerted = |c: &spillway_harness::cluster::Cluster| {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        // Absent while there is none.
        list["alerts"].as_array().is_some_and(|alerts| {
            alerts.iter().any(|a| {
                a.as_str().unwrap().starts_with(&format!("ALERT: the port report from {b1_addr}'s agent was ignored: it is not signed"))
            })
        })
    };
    wait_until(Duration::from_secs(10), "an ALERT about b1's report", || alerted(&c));
    // Several polls later, still nothing moved.
    std::thread::sleep(Duration::from_secs(5));
    let b1_entry = backend_json(&c, &vip, &b1_addr);
    assert_eq!((b1_entry["pressure"].as_str(), b1_entry["effective_weight"].as_u64()), (Some("none"), Some(100)), "{b1_entry}");
    assert!(alerted(&c));
}
