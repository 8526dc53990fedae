//! `lbd agent`'s local addresses: it decapsulates for every address of its host up to
//! `--max-local-addrs`, raises an ALERT naming the addresses left out when there are more
//! (a backend with many VIPs on `lo` would silently lose some), and says so when they fit
//! again. Needs root; everything lives in the harness's namespaces.

use std::collections::BTreeSet;
use std::time::Duration;

use spillway_harness::cluster::{XdpMode, agent_command};
use spillway_harness::{Host, Topology, TopologyConfig};

const LBD: &str = env!("CARGO_BIN_EXE_lbd");

/// The distinct addresses `ip` shows on `host` (what the agent reads, as netlink gives it).
fn addresses(host: &Host) -> BTreeSet<String> {
    let out = host.run(&["ip", "-o", "addr", "show"]).unwrap();
    out.lines().filter_map(|l| l.split_whitespace().nth(3)).filter_map(|cidr| cidr.split('/').next()).map(str::to_owned).collect()
}

#[test]
fn local_addresses_beyond_the_map_raise_an_alert_that_clears() {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let backend = &topology.backends()[0];
    let pin_dir = topology.pin_dir().unwrap();
    // Room for every routable address and one more (link-local ones are the first left
    // out, and never alerted about: no tunnel is addressed to them; loopback ones are never
    // kept).
    let routable = |a: &&String| !a.starts_with("fe80:") && a.parse::<std::net::IpAddr>().is_ok_and(|a| !a.is_loopback());
    let room = addresses(backend).iter().filter(routable).count() + 1;
    let max = room.to_string();
    let extra = ["--ports-listen", "off", "--metrics-listen", "off", "--max-local-addrs", &max, "--allow-from", "10.0.0.2/32"];
    let args = agent_command(LBD.as_ref(), XdpMode::Generic, &pin_dir, &extra);
    let agent = backend.spawn(&args).unwrap();
    agent.wait_for_output("event=ready", Duration::from_secs(20)).unwrap();
    assert!(!agent.log().contains("local_addrs_alert"), "every address fits: {}", agent.log());

    // Two VIPs more on lo: one more than the map holds is left out (the agent re-reads
    // every 5 s).
    for vip in ["10.100.0.50/32", "10.100.0.51/32"] {
        backend.run(&["ip", "addr", "add", vip, "dev", "lo"]).unwrap();
    }
    agent.wait_for_output("event=local_addrs_alert", Duration::from_secs(12)).unwrap();
    let log = agent.log();
    let alert = log.lines().find(|l| l.contains("event=local_addrs_alert")).unwrap();
    assert!(alert.contains(&format!("max={room}")) && alert.contains("ALERT") && alert.contains("--max-local-addrs"), "{alert}");
    let named = alert.split_whitespace().find_map(|kv| kv.strip_prefix("left_out=")).unwrap();
    assert!(!named.contains(',') && addresses(backend).contains(named), "names the one address left out: {alert}");

    backend.run(&["ip", "addr", "del", "10.100.0.51/32", "dev", "lo"]).unwrap();
    agent.wait_for_output("event=local_addrs_fit", Duration::from_secs(12)).unwrap();
    assert_eq!(agent.log().matches("event=local_addrs_alert").count(), 1, "one alert per change: {}", agent.log());
    assert!(agent.is_running());
}

/// Writes a report key file root's alone, as an operator would.
fn report_key(topology: &Topology) -> std::path::PathBuf {
    let path = topology.tempdir().join("report.key");
    spillway_harness::cluster::write_report_key(&path).unwrap();
    path
}

#[test]
fn without_allow_from_the_agent_refuses_to_start_naming_the_option() {
    let dir = std::env::temp_dir().join(format!("spillway-agent-allow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("agent.toml");
    std::fs::write(&config, "[agent]\niface = \"eth0\"\n").unwrap();
    for args in [&["agent", "--iface", "eth0"][..], &["agent", "--config", config.to_str().unwrap()]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lbd")).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--allow-from"), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_ports_endpoint_answers_only_the_balancers_and_a_taken_port_is_fatal() {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let (backend, client, lb) = (&topology.backends()[0], &topology.clients()[0], topology.lb());
    let pin_dir = topology.pin_dir().unwrap();
    let key = report_key(&topology);
    let extra = ["--allow-from", "10.0.0.2/32", "--report-key", key.to_str().unwrap(), "--watcher-mode", "sock_diag"];
    let args = agent_command(LBD.as_ref(), XdpMode::Generic, &pin_dir, &extra);
    // Someone took the port first: the agent does not run on without its endpoint (lbd
    // would be hearing the squatter), and says which option.
    let squatter = backend.in_netns(|| std::net::TcpListener::bind("0.0.0.0:9477").unwrap());
    let agent = backend.spawn(&args).unwrap();
    let status = agent.wait_with_timeout(Duration::from_secs(20)).unwrap().expect("the agent exits");
    assert!(!status.success() && agent.log().contains("binding --ports-listen 0.0.0.0:9477"), "{}", agent.log());
    drop(squatter);

    let agent = backend.spawn(&args).unwrap();
    agent.wait_for_output("event=ready", Duration::from_secs(20)).unwrap();
    let endpoint = std::net::SocketAddr::new(backend.ipv4().into(), 9477);
    // A client of the network is no balancer: closed without a byte.
    let answer = client.in_netns(|| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(endpoint).unwrap();
        stream.write_all(b"GET /ports HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    });
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // The balancer gets the report, signed for its poll.
    let key = spillway_ports::auth::ReportKey::load(&key).unwrap();
    let fetched = lb.in_netns(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(spillway_ports::endpoint::fetch_report(endpoint, Duration::from_secs(5), Some(&key)))
    });
    assert_eq!(fetched.unwrap().1, spillway_ports::endpoint::Signed::Verified);
    // The refusal is counted in the agent's metrics.
    let metrics = backend.in_netns(|| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect("127.0.0.1:9478").unwrap();
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    });
    assert!(metrics.contains("spillway_ports_endpoint_refused_total 1"), "{metrics}");
}
