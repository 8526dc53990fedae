use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillway_common::quic_lb::{MAX_PLAINTEXT_LEN, MAX_SERVER_ID_LEN, MIN_NONCE_LEN, MIN_SERVER_ID_LEN, QUIC_LB_F_SELF_LEN};

use super::four_pass::tests::hex;
use super::*;

fn octets(digits: &str) -> Vec<u8> {
    (0..digits.len()).step_by(2).map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap()).collect()
}

/// The key of every encrypted vector of the draft's appendix.
fn vectors_key() -> QuicLbKey {
    QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f").unwrap()
}

/// One vector of appendix B.2 ("Encrypted CIDs"; "the server is configured to encode the CID
/// length"): encoded as the draft prints it, and decoded back to its server id.
fn check_vector(config_id: u8, sid: &str, nonce: &str, cid: &str, encryption: Encryption) {
    let (sid, nonce, cid) = (octets(sid), octets(nonce), octets(cid));
    let cfg = QuicLbConfig { config_id, server_id_len: sid.len() as u8, nonce_len: nonce.len() as u8, flags: QUIC_LB_F_SELF_LEN };
    let cipher = CidCipher::new(cfg, &vectors_key()).unwrap();
    assert_eq!(cipher.encryption(), encryption);
    let mut out = [0u8; MAX_CID_LEN];
    // Low bits of 0 prove that self-length, not the caller, fills them.
    let len = cipher.encode(&ServerId::new(&sid).unwrap(), &nonce, 0, &mut out).unwrap();
    assert_eq!(out[..len], cid[..], "config {config_id}: encoded");
    assert_eq!(cipher.decode_server_id(&cid).unwrap().as_bytes(), sid, "config {config_id}: decoded");
}

/// Three octets of server id, four of nonce: four passes, three to decode.
#[test]
fn draft_vector_four_pass_short_server_id() {
    check_vector(0, "ed793a", "ee080dbf", "0720b1d07b359d3c", Encryption::FourPass);
}

/// The server id (10 octets) longer than the nonce (5): decoding takes the fourth pass.
#[test]
fn draft_vector_four_pass_long_server_id() {
    check_vector(1, "ed793a51d49b8f5fab65", "ee080dbf48", "2fcc381bc74cb4fbad2823a3d1f8fed2", Encryption::FourPass);
}

/// 8 + 8 octets: one block.
#[test]
fn draft_vector_single_pass() {
    check_vector(2, "ed793a51d49b8f5f", "ee080dbf48c0d1e5", "504dd2d05a7b0de9b2b9907afb5ecf8cc3", Encryption::SinglePass);
}

/// The fourth vector says config id 3 but prints the first octet 0x12, config 0 (3 would be
/// 0x72). The first octet is not encrypted and is no input of the encryption (the passes
/// take the length and the pass number only), so the ciphertext after it is the same
/// under either: checked under both.
#[test]
fn draft_vector_four_pass_equal_halves() {
    let (sid, nonce, rest) = ("ed793a51d49b8f5fab", "ee080dbf48c0d1e55d", "5779c9cc86beb3a3a4a3ca96fce4bfe0cdbc");
    check_vector(0, sid, nonce, &format!("12{rest}"), Encryption::FourPass);
    check_vector(3, sid, nonce, &format!("72{rest}"), Encryption::FourPass);
}

/// The odd-length split of §5.4.2's step 2: "0x7040b81b55ccf3 would split into a left_0 of
/// 0x7040b810 and right_0 of 0x0b55ccf3"; and the draft's `expand` example.
#[test]
fn the_drafts_split_example_round_trips() {
    let cipher = CidCipher::new(QuicLbConfig { config_id: 0, server_id_len: 3, nonce_len: 4, flags: 0 }, &vectors_key()).unwrap();
    let plaintext = hex::<7>("7040b81b55ccf3");
    let mut octets = plaintext;
    cipher.encrypt(&mut octets);
    assert_ne!(octets, plaintext);
    cipher.decrypt_all(&mut octets);
    assert_eq!(octets, plaintext);
}

/// Every valid configuration, both modes, random keys, server ids and nonces: the encoder's
/// ids decode to their server id, decrypt to their whole plaintext (nonce included: the
/// encryption is a permutation), keep their first octet and hide the plaintext.
#[test]
fn every_config_round_trips_under_random_keys() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0040);
    let mut modes = (0, 0);
    for server_id_len in MIN_SERVER_ID_LEN..=MAX_SERVER_ID_LEN {
        for nonce_len in MIN_NONCE_LEN..=MAX_PLAINTEXT_LEN - server_id_len {
            for flags in [0, QUIC_LB_F_SELF_LEN] {
                let cfg = QuicLbConfig { config_id: (server_id_len + nonce_len) % 7, server_id_len, nonce_len, flags };
                for _ in 0..16 {
                    let mut key = [0u8; 16];
                    rng.fill_bytes(&mut key);
                    let cipher = CidCipher::new(cfg, &QuicLbKey::new(key)).unwrap();
                    let mut plain = [0u8; MAX_CID_LEN];
                    rng.fill_bytes(&mut plain);
                    let len = cfg.cid_len();
                    let sid = ServerId::new(&plain[1..1 + server_id_len as usize]).unwrap();
                    let nonce = &plain[1 + server_id_len as usize..len];
                    let low_bits = rng.next_u32() as u8;
                    let (mut cid, mut expected) = ([0u8; MAX_CID_LEN], [0u8; MAX_CID_LEN]);
                    assert_eq!(cipher.encode(&sid, nonce, low_bits, &mut cid), Ok(len));
                    assert_eq!(encode(&cfg, &sid, nonce, low_bits, &mut expected), Ok(len));
                    assert_eq!(cid[0], expected[0], "the first octet is not encrypted");
                    assert_ne!(cid[1..len], expected[1..len], "{cfg:?}: the plaintext shows");
                    assert_eq!(cipher.decode_server_id(&cid[..len]), Ok(sid), "{cfg:?}");
                    // A short header's id runs on into the packet: the octets after it are
                    // not read.
                    assert_eq!(cipher.decode_server_id(&cid), Ok(sid), "{cfg:?}, followed by more octets");
                    let mut whole = cid;
                    cipher.decrypt_all(&mut whole[1..len]);
                    assert_eq!(whole[..len], expected[..len], "{cfg:?}: decrypted");
                    match cipher.encryption() {
                        Encryption::SinglePass => modes.0 += 1,
                        Encryption::FourPass => modes.1 += 1,
                    }
                }
            }
        }
    }
    assert!(modes.0 > 0 && modes.1 > 0, "both modes: {modes:?}");
}

/// What makes an id unroutable is what makes a plaintext one so (§4.1): the first octet and
/// the length, which encryption leaves as they are.
#[test]
fn unroutable_ids_are_refused_before_decryption() {
    let cfg = QuicLbConfig { config_id: 1, server_id_len: 3, nonce_len: 4, flags: QUIC_LB_F_SELF_LEN };
    let cipher = CidCipher::new(cfg, &vectors_key()).unwrap();
    assert_eq!(cipher.decode_server_id(&[]), Err(CidError::TooShort { len: 0, need: 1 }));
    assert_eq!(cipher.decode_server_id(&[0xe7, 1, 2, 3, 4, 5, 6, 7]), Err(CidError::Unroutable));
    assert_eq!(cipher.decode_server_id(&[0x47, 1, 2, 3, 4, 5, 6, 7]), Err(CidError::UnknownConfig { config_id: 2 }));
    assert_eq!(cipher.decode_server_id(&[0x27, 1, 2, 3, 4, 5]), Err(CidError::TooShort { len: 6, need: 8 }));
    assert_eq!(cipher.decode_server_id(&[0x26, 1, 2, 3, 4, 5, 6, 7]), Err(CidError::LengthMismatch { encoded: 6, need: 7 }));
}

#[test]
fn refuses_configs_outside_the_drafts_limits() {
    let cfg = QuicLbConfig { config_id: 0, server_id_len: 15, nonce_len: 5, flags: 0 };
    assert_eq!(CidCipher::new(cfg, &vectors_key()).unwrap_err(), ConfigError::TooLong { server_id_len: 15, nonce_len: 5 });
    assert_eq!(CidCipher::new(QuicLbConfig { config_id: 7, ..cfg }, &vectors_key()).unwrap_err(), ConfigError::ConfigId { config_id: 7 });
}

#[test]
fn debug_shows_no_key() {
    let cfg = QuicLbConfig { config_id: 0, server_id_len: 3, nonce_len: 4, flags: 0 };
    let shown = format!("{:?}", CidCipher::new(cfg, &vectors_key()).unwrap());
    assert!(shown.starts_with("CidCipher { cfg: QuicLbConfig {") && shown.ends_with(".. }"), "{shown}");
    assert!(!shown.to_lowercase().contains("8f95") && !shown.contains("143"), "{shown}");
}
