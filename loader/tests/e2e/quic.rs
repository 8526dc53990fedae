//! A QUIC VIP end to end: the real quinn echo server (`spillway-quic-lb`'s example) on every
//! backend with the server id `lbctl backends list` gives it, and the real client through
//! the balancer, moving to a new source port before each request (`--rebind`): every
//! request reaches the server the connection began on, though its 5-tuples hash all over.

use std::path::PathBuf;
use std::time::Duration;

use spillway_harness::cluster::XdpMode;
use spillway_harness::{VIP4, harness_binary};

use crate::in_both_modes;
use crate::support::*;

const QUIC_PORT: u16 = 4433;
const REQUESTS: usize = 8;

fn example(name: &str) -> PathBuf {
    let env = format!("SPILLWAY_QUIC_{}", name.replace('-', "_").to_uppercase());
    harness_binary(&format!("examples/{name}"), &env)
        .unwrap_or_else(|e| panic!("{e:#} (build it: cargo build -p spillway-quic-lb --examples)"))
}

fn rebinding_client_keeps_its_server(mode: XdpMode) {
    let (server_bin, client_bin) = (example("echo-server"), example("echo-client"));
    let c = start(mode, 3);
    let vip = format!("{VIP4}:{QUIC_PORT}/udp");
    c.lbctl(&["vips", "add", &vip, "--quic", "--quic-server-id-len", "2", "--quic-nonce-len", "6"]).unwrap();
    let mut servers = Vec::new();
    let mut cas = Vec::new();
    for (i, b) in c.topo.backends().iter().enumerate() {
        let addr = backend_addr(b, false);
        c.lbctl(&["backends", "add", "--vip", &vip, &addr]).unwrap();
        let server_id = backend_json(&c, &vip, &addr)["server_id"].as_str().expect("a QUIC VIP's backend has a server id").to_owned();
        let ca = c.topo.tempdir().join(format!("quic-b{i}.der"));
        let listen = format!("{VIP4}:{QUIC_PORT}");
        let name = format!("b{i}");
        let args = [
            server_bin.as_os_str(),
            "--listen".as_ref(),
            listen.as_ref(),
            "--server-id".as_ref(),
            server_id.as_ref(),
            "--nonce-len".as_ref(),
            "6".as_ref(),
            "--cert-out".as_ref(),
            ca.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ];
        let server = b.spawn(&args).unwrap();
        server.wait_for_output("event=listening", Duration::from_secs(10)).unwrap();
        servers.push(server);
        cas.extend(["--ca".into(), ca.into_os_string()]);
    }
    let connect = format!("{VIP4}:{QUIC_PORT}");
    let requests = REQUESTS.to_string();
    let mut args: Vec<std::ffi::OsString> = vec![
        client_bin.into(),
        "--connect".into(),
        connect.into(),
        "--requests".into(),
        requests.into(),
        "--rebind".into(),
        "--message".into(),
        "hello".into(),
    ];
    args.extend(cas);
    let client = c.topo.clients()[0].spawn(&args).unwrap();
    let status = client.wait_with_timeout(Duration::from_secs(30)).unwrap();
    let log = client.log();
    assert!(status.is_some_and(|s| s.success()), "echo-client failed ({status:?}):\n{log}");
    let answered: Vec<&str> = log.lines().filter(|l| l.starts_with("server_id=")).collect();
    assert_eq!(answered.len(), REQUESTS, "one answer a request:\n{log}");
    assert!(answered.iter().all(|l| *l == answered[0]), "the connection moved between servers:\n{log}");
    // Every request after the first came from a new port, by connection id alone.
    assert_eq!(reason_count(&c, "drop_no_backend"), 0);
    drop(servers);
}
in_both_modes!(rebinding_client_keeps_its_server);
