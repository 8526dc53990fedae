//! A QUIC VIP end to end: the real quinn echo server (`spillway-quic-lb`'s example) on every
//! backend with the server id `lbctl backends list` gives it, and the real client through
//! the balancer and agents. The connection must keep its server while the client moves to
//! new source ports and addresses, while the VIP's backends change under it (one added,
//! another drained, then its own drained), and across `lbd` restarts. Where a test claims a
//! packet reached its server by connection id alone, `lbctl flows get` shows that its
//! 5-tuple has no connection-table entry and that Maglev would send it elsewhere.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use spillway_common::{
    addr::to_words,
    maglev::{self, MaglevBackend},
};
use spillway_harness::cluster::{Cluster, XdpMode};
use spillway_harness::promql;
use spillway_harness::{Daemon, Host, Signal, VIP4, VIP6, client4, client6, harness_binary, http_get};
use spillway_model::DEFAULT_WEIGHT;

use crate::in_both_modes;
use crate::support::*;

const QUIC_PORT: u16 = 4433;
const REQUESTS: usize = 8;
/// How long the controlled client gets for each order.
const ORDER_TIMEOUT: Duration = Duration::from_secs(10);

fn example(name: &str) -> PathBuf {
    let env = format!("SPILLWAY_QUIC_{}", name.replace('-', "_").to_uppercase());
    harness_binary(&format!("examples/{name}"), &env)
        .unwrap_or_else(|e| panic!("{e:#} (build it: cargo build -p spillway-quic-lb --examples)"))
}

/// A QUIC VIP (server id 2 octets, nonce 6) and the echo servers behind it.
struct QuicService {
    /// Where clients connect, and the VIP (`/udp`).
    target: SocketAddr,
    vip: String,
    server_bin: PathBuf,
    /// Held: a server stops when its guard is dropped.
    _servers: Vec<Daemon>,
    /// `--ca` arguments for the client: every server's certificate.
    cas: Vec<OsString>,
    /// The key file of an encrypted configuration, for the servers too.
    key_file: Option<PathBuf>,
    /// Each server's orders (`--control`, a FIFO), in start order.
    controls: Vec<std::fs::File>,
}

impl QuicService {
    /// The IPv4 VIP, without backends.
    fn new(c: &Cluster) -> QuicService {
        QuicService::of_family(c, false)
    }

    /// The VIP of that family, without backends.
    fn of_family(c: &Cluster, v6: bool) -> QuicService {
        QuicService::configured(c, v6, None)
    }

    /// The VIP of that family, its ids encrypted with the key in `key_file` if given.
    fn configured(c: &Cluster, v6: bool, key_file: Option<PathBuf>) -> QuicService {
        let target = SocketAddr::new(if v6 { VIP6.into() } else { VIP4.into() }, QUIC_PORT);
        let vip = format!("{target}/udp");
        let mut args = vec!["vips", "add", &vip, "--quic", "--quic-server-id-len", "2", "--quic-nonce-len", "6"];
        let key = key_file.as_ref().map(|f| f.display().to_string());
        if let Some(key) = &key {
            args.extend(["--quic-key-file", key]);
        }
        c.lbctl(&args).unwrap();
        QuicService {
            target,
            vip,
            server_bin: example("echo-server"),
            _servers: Vec::new(),
            cas: Vec::new(),
            key_file,
            controls: Vec::new(),
        }
    }

    /// The IPv4 VIP with every backend of the cluster, each serving.
    fn start(c: &Cluster) -> QuicService {
        QuicService::start_family(c, false)
    }

    /// The VIP of that family with every backend of the cluster, each serving.
    fn start_family(c: &Cluster, v6: bool) -> QuicService {
        let mut service = QuicService::of_family(c, v6);
        for b in c.topo.backends() {
            service.serve(c, b);
        }
        service
    }

    /// Adds backend `b` to the VIP; returns the server id `lbctl` gives it.
    fn add(&self, c: &Cluster, b: &Host) -> String {
        let addr = backend_addr(b, self.target.is_ipv6());
        c.lbctl(&["backends", "add", "--vip", &self.vip, &addr]).unwrap();
        backend_json(c, &self.vip, &addr)["server_id"].as_str().expect("a QUIC VIP's backend has a server id").to_owned()
    }

    /// Adds backend `b` to the VIP and starts its echo server with the server id `lbctl`
    /// gives it; returns that id.
    fn serve(&mut self, c: &Cluster, b: &Host) -> String {
        let server_id = self.add(c, b);
        self.start_server(c, b, &server_id);
        server_id
    }

    /// Starts the echo server on `b`, issuing connection ids that name `server_id`.
    fn start_server(&mut self, c: &Cluster, b: &Host, server_id: &str) {
        let ca = c.topo.tempdir().join(format!("quic-{}.der", b.name()));
        let listen = self.target.to_string();
        let mut args: Vec<&std::ffi::OsStr> = vec![
            self.server_bin.as_os_str(),
            "--listen".as_ref(),
            listen.as_ref(),
            "--server-id".as_ref(),
            server_id.as_ref(),
            "--nonce-len".as_ref(),
            "6".as_ref(),
            "--cert-out".as_ref(),
            ca.as_os_str(),
            "--name".as_ref(),
            b.name().as_ref(),
        ];
        let control = c.topo.tempdir().join(format!("quic-control-{}", b.name()));
        if let Some(key) = &self.key_file {
            // An encrypted service's servers take rotations.
            let made = std::process::Command::new("mkfifo").arg(&control).status().unwrap();
            assert!(made.success(), "mkfifo {}", control.display());
            self.controls.push(std::fs::OpenOptions::new().read(true).write(true).open(&control).unwrap());
            args.extend(["--key-file".as_ref(), key.as_os_str(), "--control".as_ref(), control.as_os_str()]);
        }
        let server = b.spawn(&args).unwrap();
        server.wait_for_output("event=listening", Duration::from_secs(10)).unwrap();
        self._servers.push(server);
        self.cas.extend(["--ca".into(), ca.into_os_string()]);
    }

    /// The backend address whose server id is `server_id`.
    fn backend_of(&self, c: &Cluster, server_id: &str) -> IpAddr {
        let list = c.lbctl_json(&["backends", "list", "--vip", &self.vip]).unwrap();
        let b = list["backends"].as_array().unwrap().iter().find(|b| b["server_id"] == server_id);
        b.and_then(|b| b["address"].as_str()).unwrap_or_else(|| panic!("no backend has server id {server_id}: {list}")).parse().unwrap()
    }

    /// Where `lbctl flows get` says the VIP's path sends `client`'s next packet by its
    /// 5-tuple, and its Maglev slot. Panics if the tuple has a connection-table entry in
    /// force: the QUIC programs never make one for a short header.
    fn by_tuple(&self, c: &Cluster, client: SocketAddr) -> (Option<IpAddr>, usize) {
        let flow = c.lbctl_json(&["flows", "get", "--vip", &self.vip, &client.to_string()]).unwrap();
        assert!(flow["entry"]["in_force"] != true, "{client} has a connection-table entry: {flow}");
        let maglev = flow["maglev"].as_str().map(|a| a.parse().unwrap());
        assert_eq!(flow["goes_to"].as_str().map(|a| a.parse::<IpAddr>().unwrap()), maglev, "{flow}");
        (maglev, flow["slot"].as_u64().unwrap() as usize)
    }

    /// The first `n` source ports of `ip` from `from` on whose 5-tuples Maglev sends the
    /// VIP's packets to another backend than `server`: a packet from there reaches `server`
    /// by its connection id or not at all.
    fn ports_elsewhere(&self, c: &Cluster, ip: IpAddr, server: IpAddr, from: u16, n: usize) -> Vec<u16> {
        let ports: Vec<u16> = (from..from + 200).filter(|p| self.by_tuple(c, SocketAddr::new(ip, *p)).0 != Some(server)).take(n).collect();
        assert_eq!(ports.len(), n, "fewer than {n} ports of {ip} from {from} hash away from {server}");
        ports
    }
}

/// What `echo-client --control` answered to a `request`.
struct Reply {
    local: SocketAddr,
    server_id: String,
}

/// The echo client under a test's orders (`--control`, through a FIFO): one connection,
/// moved and used when the test says.
struct Client {
    process: Daemon,
    orders: std::fs::File,
    seq: usize,
}

impl Client {
    /// Connects to the VIP from client host `host`, from `bind` if given (the handshake
    /// done).
    fn connect(c: &Cluster, service: &QuicService, host: &Host, bind: Option<SocketAddr>) -> Client {
        static CLIENTS: AtomicUsize = AtomicUsize::new(0);
        let n = CLIENTS.fetch_add(1, Ordering::Relaxed);
        let fifo = c.topo.tempdir().join(format!("quic-orders-{n}"));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo {}", fifo.display());
        // Read and write: opening a FIFO so never waits for the other end, and the client
        // sees the orders' end only when this handle is dropped.
        let orders = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
        let mut args: Vec<OsString> = vec![
            example("echo-client").into(),
            "--connect".into(),
            service.target.to_string().into(),
            "--control".into(),
            fifo.into(),
            "--timeout-s".into(),
            ORDER_TIMEOUT.as_secs().to_string().into(),
        ];
        if let Some(local) = bind {
            args.extend(["--bind".into(), local.to_string().into()]);
        }
        args.extend(service.cas.iter().cloned());
        let process = host.spawn(&args).unwrap();
        process.wait_for_output("event=connected", ORDER_TIMEOUT).unwrap();
        Client { process, orders, seq: 0 }
    }

    /// Gives `order` and returns the client's line answering it.
    fn order(&mut self, order: &str) -> String {
        self.try_order(order).unwrap_or_else(|e| panic!("{order}: {e}"))
    }

    /// [`Client::order`], or the client's log if it exits (gives up) first.
    fn try_order(&mut self, order: &str) -> Result<String, String> {
        use std::io::Write;
        self.seq += 1;
        writeln!(self.orders, "{order}").unwrap();
        let tag = format!(" seq={} ", self.seq);
        self.process.wait_for_output(&tag, ORDER_TIMEOUT + Duration::from_secs(5)).map_err(|e| format!("{e:#}"))?;
        Ok(self.process.log().lines().find(|l| l.contains(&tag)).unwrap().to_owned())
    }

    fn field<'l>(line: &'l str, key: &str) -> &'l str {
        line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')).unwrap_or_else(|| panic!("no {key} in {line:?}"))
    }

    /// A request on a new stream of the connection.
    fn request(&mut self) -> Reply {
        let line = self.order("request");
        Reply { local: Self::field(&line, "local").parse().unwrap(), server_id: Self::field(&line, "server_id").to_owned() }
    }

    /// Moves the connection to a new local socket bound to `local`; returns its address.
    fn rebind(&mut self, local: SocketAddr) -> SocketAddr {
        let line = self.order(&format!("rebind {local}"));
        Self::field(&line, "local").parse().unwrap()
    }

    /// Moves to `local` and asks from there: the server that answered.
    fn request_from(&mut self, local: SocketAddr) -> String {
        assert_eq!(self.rebind(local), local);
        let reply = self.request();
        assert_eq!(reply.local, local);
        reply.server_id
    }
}

/// Where `lbd` serves its metrics, in the balancer's namespace.
const METRICS: &str = "127.0.0.1:9476";
const METRICS_MAX_AGE: Duration = Duration::from_millis(1100);

/// The cluster the tests run in: three backends, `lbd` serving its metrics.
fn cluster(mode: XdpMode) -> Cluster {
    start_with(mode, 3, 1, &["--metrics-listen", METRICS])
}

/// Short headers as `spillway_quic_short_headers_total` counts them: `placed` is
/// `by_connection_id` or `fallback`.
fn quic_count(c: &Cluster, placed: &str) -> u64 {
    // The listener serves a text up to a second old.
    std::thread::sleep(METRICS_MAX_AGE);
    let addr: SocketAddr = METRICS.parse().unwrap();
    let (status, body) = c.topo.lb().in_netns(|| http_get(addr, "/metrics", Duration::from_secs(5))).expect("scraping lbd");
    assert_eq!(status, 200, "{body}");
    let count = body.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let series = promql::series(line).pop()?;
        let ours = series.name == "spillway_quic_short_headers_total" && series.labels.iter().any(|(k, v)| k == "placed" && v == placed);
        ours.then(|| line.rsplit(' ').next()?.parse().ok()).flatten()
    });
    count.unwrap_or_else(|| panic!("no QUIC short headers placed={placed} in:\n{body}"))
}

/// The README's way: `echo-client --rebind` moves to a new source port before each request
/// after the first, and every answer names the server the connection began on, though its
/// 5-tuples hash all over.
fn rebinding_client_keeps_its_server(mode: XdpMode) {
    let c = cluster(mode);
    let service = QuicService::start(&c);
    let connect = service.target.to_string();
    let requests = REQUESTS.to_string();
    let mut args: Vec<std::ffi::OsString> = vec![
        example("echo-client").into(),
        "--connect".into(),
        connect.into(),
        "--requests".into(),
        requests.into(),
        "--rebind".into(),
        "--message".into(),
        "hello".into(),
    ];
    args.extend(service.cas.iter().cloned());
    let client = c.topo.clients()[0].spawn(&args).unwrap();
    let status = client.wait_with_timeout(Duration::from_secs(30)).unwrap();
    let log = client.log();
    assert!(status.is_some_and(|s| s.success()), "echo-client failed ({status:?}):\n{log}");
    let answered: Vec<&str> = log.lines().filter(|l| l.starts_with("server_id=")).collect();
    assert_eq!(answered.len(), REQUESTS, "one answer a request:\n{log}");
    assert!(answered.iter().all(|l| *l == answered[0]), "the connection moved between servers:\n{log}");
    // Every request after the first came from a new port, by connection id alone.
    assert_eq!(reason_count(&c, "drop_no_backend"), 0);
}
in_both_modes!(rebinding_client_keeps_its_server);

/// A key file of root's alone, in the cluster's directory.
fn key_file(c: &Cluster, name: &str, key: &str) -> PathBuf {
    let path = c.topo.tempdir().join(name);
    spillway_harness::cluster::write_secret_file(&path, key).unwrap();
    path
}

/// An encrypted VIP (the draft's key) with every backend of the cluster serving, and a client
/// connected to it: the client, its first reply, its address and the backend that answered.
fn encrypted_service_and_client(c: &Cluster) -> (QuicService, Client, Reply, IpAddr, IpAddr) {
    let key = key_file(c, "quic-0.key", "8f95f09245765f80256934e50c66207f");
    let mut service = QuicService::configured(c, false, Some(key));
    for b in c.topo.backends() {
        service.serve(c, b);
    }
    let mut client = Client::connect(c, &service, &c.topo.clients()[0], None);
    let first = client.request();
    let server = service.backend_of(c, &first.server_id);
    let ip = first.local.ip();
    (service, client, first, ip, server)
}

/// Encrypted ids (server id 2 + nonce 6: the four-pass mode): the rebinding client keeps its
/// server, every request after the first from a new port, so by its id alone; the id is
/// decrypted once, then found in the cache.
fn encrypted_ids_keep_a_rebinding_client_on_its_server(mode: XdpMode) {
    let c = cluster(mode);
    let (service, mut client, first, ip, server) = encrypted_service_and_client(&c);
    let (decrypted, cached) = (quic_count(&c, "decrypted"), quic_count(&c, "cached"));
    assert!(decrypted >= 1, "the connection's ids were never decrypted");
    for port in service.ports_elsewhere(&c, ip, server, 41000, 4) {
        assert_eq!(client.request_from(SocketAddr::new(ip, port)), first.server_id, "from port {port}");
    }
    assert!(quic_count(&c, "cached") > cached, "the moved client's packets were not found in the cache");
    // The key is in no API answer or export: only its file.
    let export = c.lbctl(&["export"]).unwrap();
    assert!(export.contains("quic-0.key") && !export.contains("8f95f0"), "{export}");
}
in_both_modes!(encrypted_ids_keep_a_rebinding_client_on_its_server);

/// The attacker: a flood of short headers with random ids from spoofed sources to an
/// encrypted VIP. Every one is a miss of the cache; at most each CPU's budget of them is
/// decrypted (the rest go by the 5-tuple), and the honest connection, whose id is cached,
/// keeps its server, moving, during and after the flood.
fn a_flood_of_random_ids_costs_the_honest_connection_nothing(mode: XdpMode) {
    use spillway_harness::{frames, send_frames};
    const FLOOD: u32 = 40_000;
    let c = cluster(mode);
    let (service, mut client, first, ip, server) = encrypted_service_and_client(&c);
    let host = &c.topo.clients()[0];
    let ports = service.ports_elsewhere(&c, ip, server, 45000, 4);
    let before = (quic_count(&c, "decrypted"), quic_count(&c, "miss_over_budget"), quic_count(&c, "fallback"));
    let macs = (c.topo.lb().netns().mac("eth0").unwrap(), host.netns().mac("eth0").unwrap());
    let started = std::time::Instant::now();
    let mut rng = spillway_harness::rng::Rng::new(7);
    let spoofed = |n: u32, id: u64| {
        let [_, b, c, d] = n.to_be_bytes();
        let src = SocketAddr::from((std::net::Ipv4Addr::new(172, 16 + (b & 15), c, d), 1024 + (n % 50_000) as u16));
        // A 1-RTT packet of config id 0 (the VIP's) and a random id.
        let mut payload = vec![0x41, (id >> 56) as u8 & 0x1f];
        payload.extend_from_slice(&id.to_be_bytes()[1..]);
        payload.extend_from_slice(&[0x5c; 32]);
        let mut frame = frames::udp(src, service.target, &payload);
        frame[..6].copy_from_slice(&macs.0);
        frame[6..12].copy_from_slice(&macs.1);
        frame
    };
    for (i, batch) in (0..FLOOD).step_by(256).enumerate() {
        let ids: Vec<u64> = (0..256).map(|_| rng.next_u64()).collect();
        host.in_netns(|| send_frames("eth0", (batch..batch + 256).zip(ids).map(|(n, id)| spoofed(n, id)))).unwrap();
        std::thread::sleep(Duration::from_micros(300));
        if i % 40 == 0 {
            let port = ports[i / 40 % ports.len()];
            assert_eq!(client.request_from(SocketAddr::new(ip, port)), first.server_id, "during the flood, from port {port}");
        }
    }
    let elapsed = started.elapsed();
    let decrypted = quic_count(&c, "decrypted") - before.0;
    let over = quic_count(&c, "miss_over_budget") - before.1;
    // Each CPU decrypts at most its burst and then its rate: the budget holds, however fast
    // the flood arrived.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let per_s = spillway_common::limits::QUIC_DECRYPTS_PER_S;
    let bound = cpus * (per_s + per_s * (elapsed.as_secs() + 1));
    assert!(decrypted <= bound, "{decrypted} decryptions in {elapsed:?}, over the budget's {bound}");
    assert!(decrypted + over > 0 && quic_count(&c, "fallback") > before.2, "the flood did not reach the balancer");
    assert_eq!(client.request().server_id, first.server_id, "after the flood");
}
in_both_modes!(a_flood_of_random_ids_costs_the_honest_connection_nothing);

/// A key rotation under live connections: a second config id with a new key on the balancer,
/// then on every server; the connection opened before keeps its server (moving, from the
/// 5-tuples that hash elsewhere), a connection opened after gets ids of the new config id and
/// keeps its server too, also once the old config id is retired.
fn a_key_rotation_keeps_live_connections_on_their_servers(mode: XdpMode) {
    use std::io::Write;
    let c = cluster(mode);
    let old_key = key_file(&c, "quic-0.key", "8f95f09245765f80256934e50c66207f");
    let new_key = key_file(&c, "quic-1.key", "00112233445566778899aabbccddeeff");
    let mut service = QuicService::configured(&c, false, Some(old_key));
    for b in c.topo.backends() {
        service.serve(&c, b);
    }
    let host = &c.topo.clients()[0];
    let mut before = Client::connect(&c, &service, host, None);
    let first = before.request();
    let ip = first.local.ip();
    let new_key_text = new_key.display().to_string();
    c.lbctl(&[
        "vips",
        "quic-next",
        &service.vip,
        "--quic-config-id",
        "1",
        "--quic-server-id-len",
        "2",
        "--quic-nonce-len",
        "6",
        "--quic-key-file",
        &new_key_text,
    ])
    .unwrap();
    for (i, (control, server)) in service.controls.iter_mut().zip(&service._servers).enumerate() {
        writeln!(control, "rotate 1 {new_key_text}").unwrap();
        server.wait_for_output("event=rotated", ORDER_TIMEOUT).unwrap_or_else(|e| panic!("server {i}: {e:#}"));
    }
    let mut after = Client::connect(&c, &service, host, None);
    let second = after.request();
    let (old_server, new_server) = (service.backend_of(&c, &first.server_id), service.backend_of(&c, &second.server_id));
    for port in service.ports_elsewhere(&c, ip, old_server, 42000, 3) {
        assert_eq!(before.request_from(SocketAddr::new(ip, port)), first.server_id, "the older connection, from port {port}");
    }
    for port in service.ports_elsewhere(&c, ip, new_server, 43000, 3) {
        assert_eq!(after.request_from(SocketAddr::new(ip, port)), second.server_id, "the newer connection, from port {port}");
    }
    // The older connection done (it may still send ids of the old config id, which the
    // retirement leaves to the 5-tuple), the old config id is retired.
    drop(before);
    c.lbctl(&["vips", "quic-retire", &service.vip]).unwrap();
    for port in service.ports_elsewhere(&c, ip, new_server, 44000, 2) {
        assert_eq!(after.request_from(SocketAddr::new(ip, port)), second.server_id, "after the retirement, from port {port}");
    }
}
in_both_modes!(a_key_rotation_keeps_live_connections_on_their_servers);

/// (a) NAT rebinding and migration: the client moves to new ports of its address, then to a
/// second address of its host, then back, each time to a 5-tuple that Maglev sends to
/// another backend. Every request reaches the server the connection began on.
fn moving_client_keeps_its_server(mode: XdpMode) {
    client_moves(mode, false);
}
in_both_modes!(moving_client_keeps_its_server);

fn ipv6_moving_client_keeps_its_server(mode: XdpMode) {
    client_moves(mode, true);
}
in_both_modes!(ipv6_moving_client_keeps_its_server);

fn client_moves(mode: XdpMode, v6: bool) {
    let c = cluster(mode);
    let service = QuicService::start_family(&c, v6);
    let host = &c.topo.clients()[0];
    let mut client = Client::connect(&c, &service, host, None);
    let first = client.request();
    let server = service.backend_of(&c, &first.server_id);
    // A second address of the client host (c2's: the cluster has one client), as a phone
    // moving from one network to another has.
    let (home, away): (IpAddr, IpAddr) = if v6 { (host.ipv6().into(), client6(2).into()) } else { (host.ipv4().into(), client4(2).into()) };
    let cidr = format!("{away}/{}", if v6 { 64 } else { 24 });
    let mut add = vec!["ip", "addr", "add", &cidr, "dev", "eth0"];
    if v6 {
        add.push("nodad");
    }
    host.run(&add).unwrap();
    let sent_before = quic_count(&c, "by_connection_id");
    for (step, ip) in [home, away, home].into_iter().enumerate() {
        for port in service.ports_elsewhere(&c, ip, server, 20_000 + 1000 * step as u16, 2) {
            let local = SocketAddr::new(ip, port);
            assert_eq!(client.request_from(local), first.server_id, "the connection moved to another server from {local}");
        }
    }
    assert!(quic_count(&c, "by_connection_id") > sent_before, "no short header went by connection id");
    assert_eq!(quic_count(&c, "fallback"), 0);
}

/// The Maglev table `lbd` builds for a VIP of `ring` slots on `members` (address, weight):
/// slot -> address. A backend's slots depend on its address, not on its id.
fn predicted_table(members: &[(IpAddr, u32)], ring: u32) -> Vec<Option<IpAddr>> {
    let backends: Vec<MaglevBackend> =
        members.iter().zip(1..).map(|((addr, weight), id)| MaglevBackend { id, addr: to_words(*addr).0, weight: *weight }).collect();
    let table = maglev::build(&backends, ring).unwrap();
    table.iter().map(|&id| (id != maglev::EMPTY_SLOT).then(|| members[id as usize - 1].0)).collect()
}

/// (b) The VIP's backends change mid-connection. A backend is added and another (not the
/// connection's) drained, so that the 5-tuple the connection is on, which Maglev gave its
/// server before, now hashes to another backend: its packets still reach their server.
/// The new backend takes a new connection, which then keeps it by id too. Then the first
/// connection's own server is drained: it keeps the connection (a draining backend keeps what
/// it has), though no Maglev slot names it any more.
fn backend_changes_keep_the_connection(mode: XdpMode) {
    let mut c = cluster(mode);
    let mut service = QuicService::start(&c);
    let host = &c.topo.clients()[0];
    let mut client = Client::connect(&c, &service, host, None);
    let first = client.request();
    let server = service.backend_of(&c, &first.server_id);
    let backends: Vec<IpAddr> = c.topo.backends().iter().map(|b| b.ipv4().into()).collect();
    let other = *backends.iter().find(|b| **b != server).unwrap();
    let b4: IpAddr = spillway_harness::backend4(4).into();
    let ring = vip_json(&c, &service.vip)["ring_size"].as_u64().unwrap() as u32;
    let before_table = predicted_table(&backends.iter().map(|b| (*b, DEFAULT_WEIGHT)).collect::<Vec<_>>(), ring);
    let mut after: Vec<(IpAddr, u32)> = backends.iter().map(|b| (*b, if *b == other { 0 } else { DEFAULT_WEIGHT })).collect();
    after.push((b4, DEFAULT_WEIGHT));
    let after_table = predicted_table(&after, ring);

    // A tuple Maglev gives the server now and will not after the change.
    let home: IpAddr = host.ipv4().into();
    let tuple = (20_000..22_000)
        .map(|port| SocketAddr::new(home, port))
        .find(|t| {
            let (maglev, slot) = service.by_tuple(&c, *t);
            assert_eq!(maglev, before_table[slot], "lbd's table is not the one predicted here (slot {slot})");
            maglev == Some(server) && after_table[slot] != Some(server)
        })
        .expect("a tuple that the change moves away from the server");
    assert_eq!(client.request_from(tuple), first.server_id);

    // The change, while the connection is open.
    let added = c.add_backend_host().unwrap();
    assert_eq!(IpAddr::from(added.ipv4()), b4);
    let added_id = service.serve(&c, &c.topo.backends()[3]);
    c.lbctl(&["backends", "drain", "--vip", &service.vip, &other.to_string()]).unwrap();
    let (_, slot) = service.by_tuple(&c, tuple);
    wait_until(Duration::from_secs(10), "the new table in force", || service.by_tuple(&c, tuple).0 == after_table[slot]);
    let moved_to = after_table[slot].unwrap();
    assert_ne!(moved_to, server);

    let sent_before = quic_count(&c, "by_connection_id");
    for _ in 0..3 {
        let reply = client.request();
        assert_eq!((reply.local, reply.server_id.as_str()), (tuple, first.server_id.as_str()), "Maglev sends {tuple} to {moved_to}");
    }
    assert!(quic_count(&c, "by_connection_id") >= sent_before + 3);
    // The new backend takes new connections (an Initial from a tuple Maglev gives it) and
    // is reached by the id its own server issues.
    let newcomer_tuple = (24_000..26_000)
        .map(|port| SocketAddr::new(home, port))
        .find(|t| service.by_tuple(&c, *t).0 == Some(b4))
        .expect("a tuple Maglev gives the new backend");
    let mut newcomer = Client::connect(&c, &service, &c.topo.clients()[0], Some(newcomer_tuple));
    assert_eq!(newcomer.request().server_id, added_id, "a new connection on a tuple Maglev gives b4");
    let away = service.ports_elsewhere(&c, home, b4, 26_000, 1)[0];
    assert_eq!(newcomer.request_from(SocketAddr::new(home, away)), added_id, "b4's connection moved");

    // Its own server drained: no slot names it, every tuple hashes elsewhere.
    c.lbctl(&["backends", "drain", "--vip", &service.vip, &server.to_string()]).unwrap();
    wait_until(Duration::from_secs(10), "the server's slots gone", || service.by_tuple(&c, tuple).0 != Some(server));
    for port in service.ports_elsewhere(&c, home, server, 23_000, 3) {
        assert_eq!(client.request_from(SocketAddr::new(home, port)), first.server_id, "the drained server lost its connection");
    }
    assert_eq!(quic_count(&c, "fallback"), 0);
}
in_both_modes!(backend_changes_keep_the_connection);

/// (c) `lbd` SIGKILLed, then stopped gracefully, each time started again, with the
/// connection in use throughout: while `lbd` is gone the pinned programs and maps go on
/// sending it by connection id, and the new `lbd` keeps that (server ids are a function of
/// the backends' addresses: the same after a restart).
fn lbd_restarts_keep_the_connection(mode: XdpMode) {
    let c = cluster(mode);
    let service = QuicService::start(&c);
    let host = &c.topo.clients()[0];
    let mut client = Client::connect(&c, &service, host, None);
    let first = client.request();
    let server = service.backend_of(&c, &first.server_id);
    let home: IpAddr = host.ipv4().into();
    // Chosen while lbd answers; every request below leaves from a tuple Maglev sends elsewhere.
    let mut tuples = service.ports_elsewhere(&c, home, server, 20_000, 8).into_iter().map(|p| SocketAddr::new(home, p));
    let mut ask = |when: &str| {
        let local = tuples.next().unwrap();
        assert_eq!(client.request_from(local), first.server_id, "{when}: the connection moved to another server from {local}");
    };
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        ask("before the restart");
        c.stop_lbd(signal).unwrap();
        ask(&format!("lbd stopped by {signal}"));
        ask(&format!("lbd stopped by {signal}"));
        c.start_lbd().expect("restarting lbd");
        ask("after the restart");
    }
    assert_eq!(backend_json(&c, &service.vip, &server.to_string())["server_id"], first.server_id.as_str(), "the server id changed");
    assert_eq!(quic_count(&c, "fallback"), 0);
}
in_both_modes!(lbd_restarts_keep_the_connection);

/// A server whose ids name a server id the balancer does not know (misconfigured: not the
/// one `lbctl backends list` gives its backend): its short headers fall back to the 5-tuple
/// and are counted. The connection works from the tuple its handshake made an entry for,
/// and ends when the client moves: that is what the fallback counter warns of.
#[test]
fn a_server_id_the_balancer_does_not_know_falls_back_and_is_counted() {
    let c = cluster(XdpMode::Native);
    let mut service = QuicService::new(&c);
    for (i, b) in c.topo.backends().iter().enumerate() {
        let known = service.add(&c, b);
        let unknown = format!("ee{i:02x}");
        assert_ne!(unknown, known);
        service.start_server(&c, b, &unknown);
    }
    let host = &c.topo.clients()[0];
    let mut client = Client::connect(&c, &service, host, None);
    let first = client.request();
    assert_eq!(client.request().server_id, first.server_id, "the handshake's tuple keeps its entry");
    assert!(quic_count(&c, "fallback") > 0, "the unknown server id was not counted");
    assert_eq!(quic_count(&c, "by_connection_id"), 0);
    assert_eq!(reason_count(&c, "drop_no_backend"), 0, "a fallback is never dropped");

    let server = c.topo.backends()[usize::from_str_radix(&first.server_id[2..], 16).unwrap()].ipv4().into();
    let away = service.ports_elsewhere(&c, host.ipv4().into(), server, 20_000, 1)[0];
    client.rebind(SocketAddr::new(host.ipv4().into(), away));
    let lost = client.try_order("request");
    assert!(lost.is_err(), "a moved connection whose id names no backend still reached its server: {lost:?}");
}
