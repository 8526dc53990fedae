//! The QUIC-LB decoders: a connection id read under a configuration by the balancer (octet
//! by octet, and as the data path's words) and by a server's generator, plaintext and
//! encrypted (both of the draft's modes), and a server id as command lines write it. The
//! input is a configuration (4 octets: config id, server id length, nonce length, flags; any
//! values, as a map could hold them), then the octets of a connection id, which are also
//! tried as a server id's text. Encrypted ids use the key of the draft's test vectors: the key
//! is the operator's, not outside input, and no path of the decoders depends on its value.
#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use spillway_common::quic_lb::{MAX_CID_LEN, QuicLbConfig, ServerId, config_id, decode_server_id, encode, server_id_words};
use spillway_quic_lb::{CidCipher, QuicLbGenerator, QuicLbKey};

/// The draft's key (appendix B.2), so the seeds hold its vectors.
const DRAFT_KEY: &str = "8f95f09245765f80256934e50c66207f";

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
    let key = QuicLbKey::from_file_text(DRAFT_KEY).expect("the draft's key");
    let Ok(cipher) = CidCipher::new(cfg, &key) else {
        assert!(cfg.validate().is_err(), "a valid configuration is refused a key");
        return;
    };
    // Encryption changes neither the first octet nor the length: an encrypted id is
    // unroutable exactly when the plaintext decoder calls it so, for the same reason.
    match cipher.decode_server_id(cid) {
        Err(error) => assert_eq!(decode_server_id(cid, &cfg), Err(error), "the decoders disagree on why an id is unroutable"),
        Ok(_) => assert!(decode_server_id(cid, &cfg).is_ok(), "only the encrypted decoder routes an id"),
    }
    // A server claims exactly the ids that decode to its own server id.
    let Ok(server_id) = ServerId::new(cid.get(..cfg.server_id_len as usize).unwrap_or(&[])) else { return };
    let generator = QuicLbGenerator::new(cfg, server_id).expect("a valid configuration and a server id of its length");
    let received = ConnectionId::new(&cid[..cid.len().min(MAX_CID_LEN)]);
    assert_eq!(generator.validate(&received).is_ok(), decode_server_id(&received, &cfg) == Ok(server_id));
    let encrypting = QuicLbGenerator::encrypted(cfg, server_id, &key).expect("a valid configuration, a key and a server id of its length");
    assert_eq!(encrypting.validate(&received).is_ok(), cipher.decode_server_id(&received) == Ok(server_id));
    // What a server encodes, the balancer decodes.
    if let Some(nonce) = cid.get(..cfg.nonce_len as usize) {
        let mut out = [0u8; MAX_CID_LEN];
        let len = encode(&cfg, &server_id, nonce, flags, &mut out).expect("a valid configuration encodes");
        assert_eq!(decode_server_id(&out[..len], &cfg), Ok(server_id), "an encoded id decodes to another server id");
        let len = cipher.encode(&server_id, nonce, flags, &mut out).expect("a valid configuration encodes");
        assert_eq!(cipher.decode_server_id(&out[..len]), Ok(server_id), "an encrypted id decodes to another server id");
    }
});
