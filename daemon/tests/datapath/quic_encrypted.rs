//! Encrypted QUIC-LB ids (draft §5.4-5.5) through the data path: the draft's vectors (appendix
//! B.2) decrypted in XDP with the kernel's AES, the cache of decoded ids, the decryption
//! budget, and a second config id beside the VIP slot's.

use std::{
    fs,
    net::{IpAddr, SocketAddr},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use spillway_common::{
    quic_lb::QUIC_LB_F_ENCRYPTED,
    types::{QuicRouting, Reason},
};
use spillway_harness::{frames, rng::Rng, tempdir::TempDir};
use spillway_model::{QuicConfig, Vip};

use crate::{
    quic::{outer_destination, routing, sent_to, short_header},
    support::*,
};

/// The key of every vector of the draft's appendix B.2.
const DRAFT_KEY: &str = "8f95f09245765f80256934e50c66207f";

/// One vector: config id, server id, nonce length, connection id. The last is printed in -21
/// with first octet 0x12 (config id 0) under config rotation bits 3; the first octet is not
/// encrypted, so it is used with 0x72.
const VECTORS: [(u8, &str, u8, &str); 4] = [
    (0, "ed793a", 4, "0720b1d07b359d3c"),
    (1, "ed793a51d49b8f5fab65", 5, "2fcc381bc74cb4fbad2823a3d1f8fed2"),
    (2, "ed793a51d49b8f5f", 8, "504dd2d05a7b0de9b2b9907afb5ecf8cc3"),
    (3, "ed793a51d49b8f5fab", 9, "725779c9cc86beb3a3a4a3ca96fce4bfe0cdbc"),
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// An IPv6 backend whose last octets are `server_id` (its server id under that length).
fn backend_named(server_id: &[u8]) -> IpAddr {
    let mut octets = [0u8; 16];
    octets[..2].copy_from_slice(&[0xfd, 0x01]);
    octets[16 - server_id.len()..].copy_from_slice(server_id);
    IpAddr::from(octets)
}

/// A key file of root's alone holding `key`, in `dir`.
fn key_file(dir: &TempDir, name: &str, key: &str) -> PathBuf {
    let path = dir.path().join(name);
    spillway_harness::cluster::write_secret_file(&path, key).unwrap();
    path
}

fn encrypted(config_id: u8, server_id_len: u8, nonce_len: u8, key_file: &Path) -> QuicConfig {
    QuicConfig { config_id, server_id_len, nonce_len, self_len: true, key_file: Some(key_file.to_path_buf()) }
}

/// [decrypted, cached, over budget].
fn decoding(env: &Env) -> [u64; 3] {
    let counts = env.balancer.maps.quic_routing().unwrap();
    let get = |what: QuicRouting| counts.iter().find(|(r, _)| *r == what).unwrap().1;
    [get(QuicRouting::Decrypted), get(QuicRouting::Cached), get(QuicRouting::MissOverBudget)]
}

/// A QUIC VIP at `addr` under `config` with the backend its vector names and two others.
fn vector_vip(env: &mut Env, addr: &str, config: &QuicConfig, server_id: &[u8]) -> (Vip, IpAddr) {
    let v = vip(&format!("[{addr}]:443/udp"));
    let named = backend_named(server_id);
    let mut others = server_id.to_vec();
    let last = others.len() - 1;
    others[last] ^= 0x01;
    let other = backend_named(&others);
    others[last] ^= 0x03;
    env.add_vip(v, &[named, other, backend_named(&others)]);
    env.update(|s| s.set_quic(&v, Some(config.clone())).unwrap());
    (v, named)
}

#[test]
fn the_drafts_encrypted_vectors_go_to_the_servers_they_name_decrypted_once() {
    let keys = TempDir::new("quic-keys");
    let draft = key_file(&keys, "draft.key", DRAFT_KEY);
    with_env(|env| {
        // The vectors' backends are addresses no lab route reaches.
        static_next_hop(env);
        for (i, (config_id, server_id, nonce_len, cid)) in VECTORS.into_iter().enumerate() {
            let server_id = hex(server_id);
            let config = encrypted(config_id, server_id.len() as u8, nonce_len, &draft);
            assert_eq!(config.to_lb().flags & QUIC_LB_F_ENCRYPTED, QUIC_LB_F_ENCRYPTED);
            let addr = format!("fd00:200::{}", i + 1);
            let (_, named) = vector_vip(env, &addr, &config, &server_id);
            let d: SocketAddr = sock(&format!("[{addr}]:443"));
            let cid = hex(cid);
            // The first packet decrypts; every later one, from any address, finds the id in
            // the cache; each goes to the backend the vector names.
            for (n, client) in ["[fd00:10::1]:40000", "[fd00:10::2]:40001", "[fd00:10::3]:50000"].into_iter().enumerate() {
                let before = (routing(env), decoding(env));
                let to = sent_to(env, sock(client), d, &short_header(&cid));
                assert_eq!(to, named, "vector {i} (config id {config_id}) from {client}");
                let (by_id, decoded) = (routing(env), decoding(env));
                assert_eq!(by_id, [before.0[0] + 1, before.0[1]], "vector {i}: placed by its id");
                let expect = if n == 0 { [before.1[0] + 1, before.1[1], before.1[2]] } else { [before.1[0], before.1[1] + 1, before.1[2]] };
                assert_eq!(decoded, expect, "vector {i}, packet {n}: decrypted once, then cached");
            }
        }
    });
}

#[test]
fn a_wrong_key_decodes_to_no_backend_and_the_packet_goes_by_its_5_tuple_uncached() {
    let keys = TempDir::new("quic-keys");
    let wrong = key_file(&keys, "wrong.key", "00112233445566778899aabbccddeeff");
    let draft = key_file(&keys, "draft.key", DRAFT_KEY);
    with_env(|env| {
        static_next_hop(env);
        let (config_id, server_id, nonce_len, cid) = VECTORS[1];
        let server_id = hex(server_id);
        let config = encrypted(config_id, server_id.len() as u8, nonce_len, &wrong);
        let (v, _) = vector_vip(env, "fd00:200::1", &config, &server_id);
        let d = sock("[fd00:200::1]:443");
        for client in ["[fd00:10::1]:40000", "[fd00:10::1]:40000"] {
            let before = (routing(env), decoding(env));
            let f = frames::udp(sock(client), d, &short_header(&hex(cid)));
            env.expect(&f, XDP_TX, Reason::Tx);
            assert_eq!(routing(env), [before.0[0], before.0[1] + 1], "by the 5-tuple, counted");
            // Not remembered: each packet decrypts again.
            assert_eq!(decoding(env), [before.1[0] + 1, before.1[1], before.1[2]]);
        }
        // With the right key file, the same id goes by its server id.
        env.update(|s| s.set_quic(&v, Some(encrypted(config_id, server_id.len() as u8, nonce_len, &draft))).unwrap());
        let before = routing(env);
        let to = sent_to(env, sock("[fd00:10::1]:40000"), d, &short_header(&hex(cid)));
        assert_eq!(to, backend_named(&server_id));
        assert_eq!(routing(env), [before[0] + 1, before[1]]);
    });
}

/// The attacker: a flood of random short headers. Each is a miss; at most the budget of them
/// is decrypted, the rest go by their 5-tuple, and the honest connection, cached, keeps its
/// server throughout.
#[test]
fn a_flood_of_random_ids_spends_the_budget_and_the_honest_id_keeps_its_server() {
    let keys = TempDir::new("quic-keys");
    let draft = key_file(&keys, "draft.key", DRAFT_KEY);
    with_env(|env| {
        static_next_hop(env);
        // Pinned to one CPU: the budget is per CPU.
        let mut one_cpu = nix::sched::CpuSet::new();
        one_cpu.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one_cpu).unwrap();
        // A burst of 40, then one a second.
        const BURST: u64 = 40;
        env.balancer.maps.set_quic_decrypt_budget(1, BURST).unwrap();
        let start = std::time::Instant::now();
        let (config_id, server_id, nonce_len, cid) = VECTORS[0];
        let server_id = hex(server_id);
        let config = encrypted(config_id, server_id.len() as u8, nonce_len, &draft);
        let (_, named) = vector_vip(env, "fd00:200::1", &config, &server_id);
        let d = sock("[fd00:200::1]:443");
        let honest = sock("[fd00:10::1]:40000");
        assert_eq!(sent_to(env, honest, d, &short_header(&hex(cid))), named);
        let mut rng = Rng::new(40);
        let before = decoding(env);
        for i in 0..200u32 {
            // Config id 0 (the top three bits clear), the rest random.
            let mut id = rng.next_u64().to_be_bytes();
            id[0] &= 0x1f;
            let attacker = sock(&format!("[fd00:66::{:x}]:{}", i % 50 + 1, 1024 + i));
            let f = frames::udp(attacker, d, &short_header(&id));
            let out = env.run(&f);
            assert_eq!(out.action, XDP_TX, "a flood packet is placed, by its id or its 5-tuple");
            if i % 20 == 0 {
                assert_eq!(
                    outer_destination(&env.expect(&frames::udp(honest, d, &short_header(&hex(cid))), XDP_TX, Reason::Tx).frame),
                    named
                );
            }
        }
        let after = decoding(env);
        let decrypted = after[0] - before[0];
        let budget = BURST + start.elapsed().as_secs() + 1;
        assert!(decrypted <= budget, "{decrypted} random ids decrypted, over the budget of {budget}");
        assert_eq!(after[2] - before[2], 200 - decrypted, "the rest counted over budget");
        // Cached all along: the honest id costs no decryption.
        assert_eq!(after[1] - before[1], 10);
    });
}

/// A key rotation: a second config id (`quic_next`) beside the VIP slot's, with its own key
/// file; ids of both go to their servers, and once the old one is retired its ids go by the
/// 5-tuple.
#[test]
fn two_config_ids_are_live_at_once_each_with_its_key() {
    let keys = TempDir::new("quic-keys");
    let draft = key_file(&keys, "draft.key", DRAFT_KEY);
    let other = key_file(&keys, "other.key", "00112233445566778899aabbccddeeff");
    with_env(|env| {
        static_next_hop(env);
        let (old_id, server_id, nonce_len, old_cid) = VECTORS[0];
        let server_id = hex(server_id);
        // The current config id under another key; the draft's ciphertext is then read right
        // only under the new config id, with the draft's key.
        let old = encrypted(old_id, server_id.len() as u8, nonce_len, &other);
        let (v, named) = vector_vip(env, "fd00:200::1", &old, &server_id);
        let new_id = 5u8;
        let mut new_cid = hex(old_cid);
        new_cid[0] = new_cid[0] & 0x1f | new_id << 5;
        let d = sock("[fd00:200::1]:443");
        let before = routing(env);
        let f = frames::udp(sock("[fd00:10::1]:40000"), d, &short_header(&new_cid));
        env.expect(&f, XDP_TX, Reason::Tx);
        assert_eq!(routing(env), [before[0], before[1] + 1], "an unknown config id goes by the 5-tuple");
        let new = encrypted(new_id, server_id.len() as u8, nonce_len, &draft);
        env.update(|s| s.set_quic_next(&v, Some(new)).unwrap());
        assert_eq!(sent_to(env, sock("[fd00:10::2]:40000"), d, &short_header(&new_cid)), named);
        // An id of the old config id still decrypts, under its own key (to some server id:
        // the vector was made with the draft's key), and is counted.
        let before = decoding(env);
        env.expect(&frames::udp(sock("[fd00:10::3]:40000"), d, &short_header(&hex(old_cid))), XDP_TX, Reason::Tx);
        assert_eq!(decoding(env)[0], before[0] + 1, "the old config id's ids are decrypted too");
        // Retired: the new config id is the slot's, the old one's ids go by the 5-tuple.
        env.update(|s| s.retire_quic(&v).unwrap());
        assert_eq!(sent_to(env, sock("[fd00:10::4]:40000"), d, &short_header(&new_cid)), named);
        let before = (routing(env), decoding(env));
        env.expect(&frames::udp(sock("[fd00:10::5]:40000"), d, &short_header(&hex(old_cid))), XDP_TX, Reason::Tx);
        assert_eq!(routing(env), [before.0[0], before.0[1] + 1]);
        assert_eq!(decoding(env), before.1, "no decryption for a retired config id");
    });
}

/// A key file others may read is refused when a change names it, saying which file and what
/// to do.
#[test]
fn a_key_file_others_may_read_is_refused_naming_it() {
    let keys = TempDir::new("quic-keys");
    let exposed = key_file(&keys, "exposed.key", DRAFT_KEY);
    fs::set_permissions(&exposed, fs::Permissions::from_mode(0o644)).unwrap();
    with_env(|env| {
        let v = vip("[fd00:200::1]:443/udp");
        env.add_vip(v, &[backend_named(&[1, 2, 3])]);
        let mut state = env.state.clone();
        state.set_quic(&v, Some(encrypted(0, 3, 4, &exposed))).unwrap();
        let err = env.reconciler.apply(&mut env.balancer.maps, &state).unwrap_err().to_string();
        assert!(err.contains("exposed.key") && err.contains("chmod 600"), "{err}");
    });
}
