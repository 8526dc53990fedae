//! An agent's answer to `lbd`'s port poll (`GET /ports`), as `lbd` decodes it: the HTTP/1
//! head, the signature header, the JSON report. With the key the answer is checked against
//! the poll's nonce; the key decides only whether the report is trusted, never what it says
//! or whether it parses.
#![no_main]

use std::hint::black_box;
use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use spillway_ports::auth::ReportKey;
use spillway_ports::endpoint::{Signed, decode_answer};

/// The key, nonce and agent the seeds in `seeds/ports_report` are signed for.
const SECRET: [u8; 32] = [7; 32];
const NONCE: &str = "00112233445566778899aabbccddeeff";
const AGENT: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, 1)), 9477);

fuzz_target!(|bytes: &[u8]| {
    let key = ReportKey::from_secret(&SECRET);
    match (decode_answer(AGENT, bytes, Some((&key, NONCE))), decode_answer(AGENT, bytes, None)) {
        (Ok((checked, signed)), Ok((unchecked, Signed::Unchecked))) => {
            assert_eq!(checked, unchecked, "the key changed the report");
            assert_ne!(signed, Signed::Unchecked, "a report checked with a key is said unchecked");
            // What lbd asks of a report it trusts.
            black_box(checked.level());
        }
        (Err(_), Err(_)) => {}
        other => panic!("the key changed whether the answer decodes: {other:?}"),
    }
});
