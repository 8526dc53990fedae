//! The QUIC-LB decoders: a connection id read under a configuration by the balancer (octet
//! by octet, and as the data path's words) and by a server's generator, and a server id as
//! command lines write it. The input is a configuration (4 octets: config id, server id
//! length, nonce length, flags; any values, as a map could hold them), then the octets of a
//! connection id, which are also tried as a server id's text.
#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use spillway_common::quic_lb::{MAX_CID_LEN, QuicLbConfig, ServerId, config_id, decode_server_id, encode, server_id_words};
use spillway_quic_lb::QuicLbGenerator;

fuzz_target!(|bytes: &[u8]| {
    let Some((&[config_id_octet, server_id_len, nonce_len, flags], cid)) = bytes.split_first_chunk::<4>() else { return };
    let cfg = QuicLbConfig { config_id: config_id_octet, server_id_len, nonce_len, flags };
    let _ = black_box(config_id(cid));
    let _ = black_box(decode_server_id(cid, &cfg));
    if let Some(whole) = cid.get(..MAX_CID_LEN) {
        // The data path loads the id's first 16 octets as two little-endian words.
        let word = |at: usize| u64::from_le_bytes(whole[at..at + 8].try_into().expect("8 octets"));
        let words = server_id_words(word(0), word(8), &cfg);
        assert_eq!(words, decode_server_id(whole, &cfg).map(|id| id.words()), "the data path's words and the octets disagree");
    }
    if let Ok(text) = std::str::from_utf8(cid)
        && let Ok(id) = text.parse::<ServerId>()
    {
        assert_eq!(id.to_string().parse::<ServerId>(), Ok(id), "a server id's text does not read back");
    }
    if cfg.validate().is_err() {
        return;
    }
    // A server claims exactly the ids that decode to its own server id.
    let Ok(server_id) = ServerId::new(cid.get(..cfg.server_id_len as usize).unwrap_or(&[])) else { return };
    let generator = QuicLbGenerator::new(cfg, server_id).expect("a valid configuration and a server id of its length");
    let received = ConnectionId::new(&cid[..cid.len().min(MAX_CID_LEN)]);
    assert_eq!(generator.validate(&received).is_ok(), decode_server_id(&received, &cfg) == Ok(server_id));
    // What a server encodes, the balancer decodes.
    if let Some(nonce) = cid.get(..cfg.nonce_len as usize) {
        let mut out = [0u8; MAX_CID_LEN];
        let len = encode(&cfg, &server_id, nonce, flags, &mut out).expect("a valid configuration encodes");
        assert_eq!(decode_server_id(&out[..len], &cfg), Ok(server_id), "an encoded id decodes to another server id");
    }
});
