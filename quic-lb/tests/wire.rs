//! On the wire: every packet a client sends once it has the server's connection ids carries
//! one that decodes to the server's id, before and after the client's port changes. A relay
//! on loopback between the two records what the client sends.

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spillway_common::quic_lb::decode_server_id;
use spillway_quic_lb::{CidCipher, QUIC_LB_F_SELF_LEN, QuicLbConfig, QuicLbGenerator, QuicLbKey, ServerId};

#[allow(dead_code)] // `controlled` serves echo-client
#[path = "../examples/support/mod.rs"]
mod support;

/// The destination connection id of the first packet of a datagram, and whether it is a
/// short header (RFC 9000 §17.2, §17.3; the short header's DCID has the length the server's
/// ids have). Client Initials are None: their first DCID is the client's own random one.
fn dcid(datagram: &[u8], short_len: usize) -> Option<(bool, &[u8])> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        return Some((true, datagram.get(1..1 + short_len)?));
    }
    let long_type = (first >> 4) & 0x3;
    let len = *datagram.get(5)? as usize;
    (long_type != 0).then_some((false, datagram.get(6..6 + len)?))
}

/// Forwards datagrams between the client (whatever its port now) and `server`, recording
/// the client's. Runs until aborted.
async fn relay(front: tokio::net::UdpSocket, server: SocketAddr, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let back = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut client = None;
    let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
    loop {
        tokio::select! {
            Ok((n, from)) = front.recv_from(&mut a) => {
                client = Some(from);
                seen.lock().unwrap().push(a[..n].to_vec());
                let _ = back.send_to(&a[..n], server).await;
            }
            Ok(n) = back.recv(&mut b) => {
                if let Some(to) = client {
                    let _ = front.send_to(&b[..n], to).await;
                }
            }
        }
    }
}

/// What the client sends through the relay while it makes three requests to a server with
/// `generator`'s ids, moving to a new port before each after the first.
async fn client_datagrams(generator: QuicLbGenerator) -> Vec<Vec<u8>> {
    let banner = format!("server_id={}\n", generator.server_id());
    let (server, cert) = support::server_endpoint(UdpSocket::bind("127.0.0.1:0").unwrap(), generator).unwrap();
    let server_addr = server.local_addr().unwrap();
    let serving = tokio::spawn(support::serve_echo(server, banner.clone()));

    let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let relaying = tokio::spawn(relay(front, server_addr, seen.clone()));

    let client = support::client_endpoint(support::local_socket(front_addr).unwrap(), vec![cert]).unwrap();
    let exchange = support::exchange(&client, front_addr, b"ping", 3, true);
    let replies = tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("no reply in 10 s").unwrap();
    assert_eq!(replies, vec![format!("{banner}ping").into_bytes(); 3]);
    relaying.abort();
    serving.abort();
    std::mem::take(&mut *seen.lock().unwrap())
}

/// The destination ids of `datagrams` (see [`dcid`]), at least three short headers among them.
fn client_dcids(datagrams: &[Vec<u8>], cid_len: usize) -> Vec<(bool, &[u8])> {
    let ids: Vec<(bool, &[u8])> = datagrams.iter().filter_map(|d| dcid(d, cid_len)).collect();
    let short = ids.iter().filter(|(short, _)| *short).count();
    assert!(short >= 3, "{short} short-header packets of {} datagrams", datagrams.len());
    ids
}

#[tokio::test]
async fn client_packets_carry_the_server_id() {
    let cfg = QuicLbConfig { config_id: 2, server_id_len: 3, nonce_len: 5, flags: 0 };
    let sid: ServerId = "c4605e".parse().unwrap();
    let seen = client_datagrams(QuicLbGenerator::new(cfg, sid).unwrap()).await;
    for (is_short, id) in client_dcids(&seen, cfg.cid_len()) {
        assert_eq!(decode_server_id(id, &cfg), Ok(sid), "short header: {is_short}, dcid {id:02x?}");
    }
}

/// Encrypted, in both modes: every id the client sends decodes to the server id with the key,
/// and the server id does not show in any of them.
#[tokio::test]
async fn client_packets_carry_the_server_id_encrypted() {
    let key = QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f\n").unwrap();
    for (cfg, sid) in [
        (QuicLbConfig { config_id: 2, server_id_len: 3, nonce_len: 5, flags: 0 }, "c4605e"),
        (QuicLbConfig { config_id: 4, server_id_len: 8, nonce_len: 8, flags: QUIC_LB_F_SELF_LEN }, "c4605e0102030405"),
    ] {
        let sid: ServerId = sid.parse().unwrap();
        let seen = client_datagrams(QuicLbGenerator::encrypted(cfg, sid, &key).unwrap()).await;
        let cipher = CidCipher::new(cfg, &key).unwrap();
        for (is_short, id) in client_dcids(&seen, cfg.cid_len()) {
            assert_eq!(cipher.decode_server_id(id), Ok(sid), "{:?}, short header: {is_short}, dcid {id:02x?}", cipher.encryption());
            assert_ne!(decode_server_id(id, &cfg), Ok(sid), "the server id shows: dcid {id:02x?}");
        }
    }
}

/// A key rotation under a live connection: the connection made before goes on (its ids are of
/// the old configuration), one made after gets ids of the new configuration and key, and
/// every id either names the server under its own configuration.
#[tokio::test]
async fn a_rotation_keeps_the_live_connection_and_gives_new_ones_the_new_config() {
    let old_cfg = QuicLbConfig { config_id: 1, server_id_len: 2, nonce_len: 6, flags: 0 };
    let new_cfg = QuicLbConfig { config_id: 2, ..old_cfg };
    let old_key = QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f").unwrap();
    let new_key = QuicLbKey::new([0x5a; 16]);
    let sid: ServerId = "0a01".parse().unwrap();
    let generator = QuicLbGenerator::encrypted(old_cfg, sid, &old_key).unwrap();
    let (server, cert) = support::server_endpoint(UdpSocket::bind("127.0.0.1:0").unwrap(), generator.clone()).unwrap();
    let server_addr = server.local_addr().unwrap();
    let serving = tokio::spawn(support::serve_echo(server, "0a01\n".to_owned()));
    let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let relaying = tokio::spawn(relay(front, server_addr, seen.clone()));
    let client = support::client_endpoint(support::local_socket(front_addr).unwrap(), vec![cert]).unwrap();

    let exchange = async {
        let before = client.connect(front_addr, support::SERVER_NAME).unwrap().await.unwrap();
        assert_eq!(support::request(&before, b"1").await.unwrap(), b"0a01\n1");
        let sent_before = seen.lock().unwrap().len();
        generator.rotate(new_cfg, sid, Some(&new_key)).unwrap();
        assert_eq!(support::request(&before, b"2").await.unwrap(), b"0a01\n2");
        let after = client.connect(front_addr, support::SERVER_NAME).unwrap().await.unwrap();
        assert_eq!(support::request(&after, b"3").await.unwrap(), b"0a01\n3");
        assert_eq!(support::request(&before, b"4").await.unwrap(), b"0a01\n4");
        sent_before
    };
    let sent_before = tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("no reply in 10 s");
    relaying.abort();
    serving.abort();

    let seen = seen.lock().unwrap();
    let (old, new) = (CidCipher::new(old_cfg, &old_key).unwrap(), CidCipher::new(new_cfg, &new_key).unwrap());
    let ids = client_dcids(&seen, old_cfg.cid_len());
    let mut under_new = 0;
    for (is_short, id) in &ids {
        let by_new = new.decode_server_id(id) == Ok(sid);
        assert!(by_new || old.decode_server_id(id) == Ok(sid), "short header: {is_short}, dcid {id:02x?} names no server");
        under_new += usize::from(by_new);
    }
    assert!(under_new > 0, "no id of the new configuration among {} ids", ids.len());
    let mut before = seen[..sent_before].iter().filter_map(|d| dcid(d, old_cfg.cid_len()));
    assert!(before.all(|(_, id)| old.decode_server_id(id) == Ok(sid)), "an id of the new configuration before the rotation");
}
