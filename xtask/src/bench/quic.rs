//! A QUIC VIP's packets, as multiples of the floor measured in the same run, next to the
//! connection-table hit and the new flow of a TCP VIP on the same backends: a short header
//! sent by its connection id (the balancer, the QUIC program it tail-calls, the id's lookup;
//! no table entry read or made) and an Initial from a new client (placed by Maglev through
//! the UDP program, a second tail call, and remembered), and a long header of a known flow
//! (the same two tail calls, then a table hit: what a QUIC VIP's packets that the id does not
//! place pay over a plain UDP VIP's hit). The short header's goal is the
//! table hit's ratio of this run: routing by id must cost no more than the table it replaces.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result, ensure};
use spillway_common::{
    limits::{Capacity, DEFAULT_RING_SIZE},
    quic_lb::{MAX_CID_LEN, encode},
};
use spillway_harness::{frames, packet_lab};
use spillway_model::{DEFAULT_WEIGHT, DesiredState, QuicConfig, Vip, server_id_of};

use super::{
    Section,
    packets::{CHUNK, CLIENT, Case, Flows, Frames, Lab, VIP, flow_key},
};

const QUIC_VIP: &str = "10.200.1.4:443/udp";
/// A plain UDP VIP: its table hit, on the short header's own frame, tells what a UDP packet
/// of that size costs without QUIC.
const UDP_VIP: &str = "10.200.1.5:443/udp";
/// A QUIC VIP whose servers encrypt their ids (four-pass: server id 2 + nonce 6 octets).
const ENCRYPTED_VIP: &str = "10.200.1.6:443/udp";
/// One whose ids are one AES block (single pass: server id 2 + nonce 14 octets).
const SINGLE_PASS_VIP: &str = "10.200.1.7:443/udp";
const SINGLE_PASS: QuicConfig = QuicConfig { nonce_len: 14, ..QUIC };
/// The draft's key (appendix B.2).
const BENCH_KEY: &str = "8f95f09245765f80256934e50c66207f";
/// The cached encrypted short header's goal, times the plaintext short header's ratio.
const CACHED_GOAL: f64 = 1.1;
const QUIC: QuicConfig = QuicConfig { config_id: 0, server_id_len: 2, nonce_len: 6, self_len: false, key_file: None };
/// A 1-RTT packet's octets after its connection id: packet number and a payload as long as
/// the AEAD tag (the balancer reads none of it).
const SHORT_HEADER_TAIL: usize = 2 + 16;
/// The first octet of a Handshake packet (RFC 9000 §17.2.4: long form, fixed bit, type 2).
const LONG_HEADER_HANDSHAKE: u8 = 0xe0;
/// A client's Initial is padded to at least this (RFC 9000 §14.1).
const INITIAL_LEN: usize = 1200;

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    let flows = Flows::new()?;
    Lab::sized(Capacity::DEFAULT, |lab| {
        let mut cases = cases(lab, &flows)?;
        // A miss per mode: every call an id never seen, so every call decrypts (the budget
        // lifted, or the calls past it would go by the 5-tuple).
        lab.balancer.maps.set_quic_decrypt_budget(1_000_000_000, 1_000_000_000)?;
        let ids = calls * (reps + 1) + 64;
        cases.push(miss_case(lab, "quic_miss_four_pass", ENCRYPTED_VIP, &QUIC, ids)?);
        cases.push(miss_case(lab, "quic_miss_single_pass", SINGLE_PASS_VIP, &SINGLE_PASS, ids)?);
        let (short, initial) = (cases[3].frames.frame().len(), cases[4].frames.frame().len());
        let medians = lab.measure(&cases, calls, reps)?;
        let ratio = |i: usize| medians[i] / medians[0];
        let mut text = String::new();
        writeln!(
            text,
            "QUIC VIP {QUIC_VIP} (QUIC-LB plaintext, server id {} octets, nonce {}), {} backends: a {}-byte short header whose \
             connection id names a backend (not its 5-tuple's Maglev choice), a {}-byte Initial from a new client on every \
             call; TCP VIP {VIP} alongside, and UDP VIP {UDP_VIP} (udp_table_hit: the short header's frame, sent \
             to it, hitting its connection-table entry; quic_long_header_hit: a Handshake packet of the same size, of a flow \
             the table knows). {calls} calls per case per repetition in chunks of {CHUNK}, median of {reps}.",
            QUIC.server_id_len,
            QUIC.nonce_len,
            packet_lab::RESOLVED_BACKENDS.count(),
            short,
            initial,
        )?;
        writeln!(text, "{:<22} | {:>9} | {:>7} | {:>6}", "case", "ns/packet", "x floor", "goal")?;
        writeln!(text, "{:-<22}-|-{:->9}-|-{:->7}-|-{:->6}", "", "", "", "")?;
        let mut rows = Vec::new();
        for (i, case) in cases.iter().enumerate().skip(1) {
            // Goals in this run's terms: the short header at most the table hit, a cached
            // encrypted one at most 1.1 times the short header.
            let goal = match case.name.as_str() {
                "quic_short_header" => format!("{:.2}", ratio(1)),
                "quic_encrypted_cached" => format!("{:.2}", CACHED_GOAL * ratio(3)),
                _ => "-".to_owned(),
            };
            writeln!(text, "{:<22} | {:>9.1} | {:>7.2} | {goal:>6}", case.name, medians[i], ratio(i))?;
            if case.name.starts_with("quic_") || case.name == "udp_table_hit" {
                rows.push((case.name.clone(), medians[i]));
                rows.push((format!("{}_x_floor", case.name), ratio(i)));
            }
        }
        writeln!(
            text,
            "quic_short_header goal: <= table_hit's ratio of this run ({:.2}); {}. quic_initial is a UDP new flow after two \
             tail calls (new_flow: a TCP one, without them).",
            ratio(1),
            if ratio(3) <= ratio(1) { "met" } else { "not met" }
        )?;
        writeln!(
            text,
            "quic_encrypted_cached: VIP {ENCRYPTED_VIP}, the same short header with its id encrypted (four-pass), found in the cache of decoded ids; goal <= {CACHED_GOAL} x quic_short_header ({:.2}); {}.",
            CACHED_GOAL * ratio(3),
            if ratio(7) <= CACHED_GOAL * ratio(3) { "met" } else { "not met" }
        )?;
        for (i, mode) in [(8, "four-pass"), (9, "single-pass")] {
            let decrypt = medians[i] - medians[7];
            writeln!(
                text,
                "{}: a new encrypted id ({mode}) on every call, decrypted and remembered: {:.1} ns, {decrypt:.1} ns over a cached \
                 one; one core absorbs about {:.0} such misses a second.",
                cases[i].name,
                medians[i],
                1e9 / medians[i]
            )?;
            rows.push((format!("{}_misses_per_s_one_core", cases[i].name), 1e9 / medians[i]));
        }
        rows.push(("quic_short_header_goal_x_floor".into(), ratio(1)));
        Ok(Section { text, rows, ..Section::default() })
    })
}

/// Configures `lab`'s VIPs and returns this part's cases: the floor, TCP's table hit and new
/// flow, the short header, the Initial, and the UDP VIP's table hit.
pub fn cases(lab: &mut Lab, flows: &Flows) -> Result<Vec<Case>> {
    configure(lab)?;
    let client: SocketAddr = CLIENT.parse()?;
    let quic_vip: Vip = QUIC_VIP.parse()?;
    let to = SocketAddr::new(quic_vip.addr, quic_vip.port);
    // The id names a backend the 5-tuple's Maglev choice is not, so the checked output
    // shows the id chose.
    let tuple = flow_key(&frames::udp(client, to, &[0x40]))?;
    let maglev = lab.maglev_backend(&tuple)?;
    let named = packet_lab::RESOLVED_BACKENDS.map(packet_lab::backend4).find(|b| *b != maglev).context("one lab backend")?;
    let payload = short_header(&connection_id(named.into())?);
    let short = frames::udp(client, to, &payload);
    let initial = frames::udp(client, to, &initial());
    let udp_vip: Vip = UDP_VIP.parse()?;
    let udp = frames::udp(client, SocketAddr::new(udp_vip.addr, udp_vip.port), &payload);
    // A long header of a client the table knows (another port than the short header's,
    // whose tuple must stay out of the table): its packets go QUIC program, UDP program, hit.
    let mut long_header = payload.clone();
    long_header[0] = LONG_HEADER_HANDSHAKE;
    let long = frames::udp(SocketAddr::new(client.ip(), client.port() + 1), to, &long_header);
    let encrypted_vip: Vip = ENCRYPTED_VIP.parse()?;
    let sealed = short_header(&encrypted_connection_id(named.into())?);
    let encrypted = frames::udp(client, SocketAddr::new(encrypted_vip.addr, encrypted_vip.port), &sealed);
    Ok(vec![
        Case::floor(&flows.syn),
        Case::forwarded("table_hit", Frames::Established { syn: flows.syn.clone(), frame: flows.ack.clone() }, false),
        Case::forwarded("new_flow", Frames::NewFlows(flows.syn.clone()), true),
        Case::forwarded("quic_short_header", Frames::ByConnectionId { frame: short, backend: named }, false),
        Case::forwarded("quic_initial", Frames::NewFlows(initial), true),
        Case::forwarded("udp_table_hit", Frames::Established { syn: udp.clone(), frame: udp }, false),
        Case::forwarded("quic_long_header_hit", Frames::Established { syn: long.clone(), frame: long }, false),
        Case::forwarded("quic_encrypted_cached", Frames::ByConnectionId { frame: encrypted, backend: named }, false),
    ])
}

/// [`VIP`] (TCP), [`QUIC_VIP`] and [`UDP_VIP`], each on the lab's backends.
fn configure(lab: &mut Lab) -> Result<()> {
    let mut state = DesiredState::default();
    let (tcp, quic, udp): (Vip, Vip, Vip) = (VIP.parse()?, QUIC_VIP.parse()?, UDP_VIP.parse()?);
    let (encrypted, single): (Vip, Vip) = (ENCRYPTED_VIP.parse()?, SINGLE_PASS_VIP.parse()?);
    for vip in [tcp, quic, udp, encrypted, single] {
        state.add_vip(vip, DEFAULT_RING_SIZE)?;
        for n in packet_lab::RESOLVED_BACKENDS {
            state.add_backend(&vip, packet_lab::backend4(n).into(), DEFAULT_WEIGHT)?;
        }
    }
    state.set_quic(&quic, Some(QUIC))?;
    // The key file is read once, when the change is applied: the key then lives in the kernel.
    let keys = spillway_harness::tempdir::TempDir::new("bench-quic-key");
    let key_file = keys.path().join("quic.key");
    spillway_harness::cluster::write_secret_file(&key_file, BENCH_KEY)?;
    state.set_quic(&encrypted, Some(QuicConfig { key_file: Some(key_file.clone()), ..QUIC }))?;
    state.set_quic(&single, Some(QuicConfig { key_file: Some(key_file), ..SINGLE_PASS }))?;
    lab.reconciler.apply(&mut lab.balancer.maps, &state).context("configuring the VIPs")?;
    Ok(())
}

/// [`connection_id`] encrypted with [`BENCH_KEY`], as an encrypting `QuicLbGenerator` issues.
fn encrypted_connection_id(backend: IpAddr) -> Result<Vec<u8>> {
    encrypted_id(&QUIC, backend, &[0x5e, 0x11, 0xa1, 0x07, 0x42, 0x99])
}

/// An id under `config` encrypted with [`BENCH_KEY`], naming `backend`, with `nonce`.
fn encrypted_id(config: &QuicConfig, backend: IpAddr, nonce: &[u8]) -> Result<Vec<u8>> {
    let key = spillway_quic_lb::QuicLbKey::from_file_text(BENCH_KEY)?;
    let cipher = spillway_quic_lb::CidCipher::new(config.to_lb(), &key)?;
    let mut out = [0u8; MAX_CID_LEN];
    let len = cipher.encode(&server_id_of(backend, config.server_id_len), nonce, 0x0b, &mut out)?;
    Ok(out[..len].to_vec())
}

/// A short header to `vip` (configured `config`) with a new encrypted id naming a backend on
/// every call, `ids` of them.
fn miss_case(lab: &mut Lab, name: &str, vip: &str, config: &QuicConfig, ids: usize) -> Result<Case> {
    let vip: Vip = vip.parse()?;
    let to = SocketAddr::new(vip.addr, vip.port);
    let client: SocketAddr = CLIENT.parse()?;
    let maglev = lab.maglev_backend(&flow_key(&frames::udp(client, to, &[0x40]))?)?;
    let named = packet_lab::RESOLVED_BACKENDS.map(packet_lab::backend4).find(|b| *b != maglev).context("one lab backend")?;
    let nonce_len = usize::from(config.nonce_len);
    let ids = (0..ids as u64)
        .map(|n| {
            encrypted_id(
                config,
                named.into(),
                &n.to_be_bytes().iter().copied().cycle().skip(8 - nonce_len.min(8)).take(nonce_len).collect::<Vec<u8>>(),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let frame = frames::udp(client, to, &short_header(&ids[0]));
    // Ethernet, IPv4, UDP, then the short header's first octet.
    let dcid_at = 14 + 20 + 8 + 1;
    Ok(Case::forwarded(name, Frames::NewConnectionIds { frame, backend: named, dcid_at, ids }, false))
}

/// A connection id naming `backend`'s server id, as its `QuicLbGenerator` would issue.
fn connection_id(backend: IpAddr) -> Result<Vec<u8>> {
    let mut out = [0u8; MAX_CID_LEN];
    let len = encode(&QUIC.to_lb(), &server_id_of(backend, QUIC.server_id_len), &[0x5e, 0x11, 0xa1, 0x07, 0x42, 0x99], 0x0b, &mut out)
        .context("encoding the connection id")?;
    ensure!(len == QUIC.to_lb().cid_len(), "a {len}-octet connection id");
    Ok(out[..len].to_vec())
}

/// A 1-RTT packet to `dcid` (RFC 9000 §17.3: fixed bit, key phase 0, 2-octet packet number).
fn short_header(dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![0x41];
    p.extend_from_slice(dcid);
    p.resize(p.len() + SHORT_HEADER_TAIL, 0x5c);
    p
}

/// A QUIC v1 Initial with the client's random 8-octet destination id, padded as clients pad.
fn initial() -> Vec<u8> {
    let mut p = vec![0xc3, 0, 0, 0, 1, 8, 0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08, 0];
    p.extend_from_slice(&[0, 0x44, 0xc4]);
    p.resize(INITIAL_LEN, 0);
    p
}
