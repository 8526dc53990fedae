//! A request on `lbd`'s control socket, as the server decodes the line it read: at most
//! `MAX_REQUEST_BYTES`, one JSON object, known fields only. A request that decodes must
//! decode again from its own encoding (what `lbctl` sends), and an `apply` carries a
//! configuration file, which `lbd` parses next.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_api::Request;
use spillway_model::config::Document;

fuzz_target!(|bytes: &[u8]| {
    let Ok(request) = Request::decode(bytes) else { return };
    let line = serde_json::to_string(&request).expect("a decoded request encodes");
    assert_eq!(Request::decode(line.as_bytes()).as_ref(), Ok(&request), "its encoding decodes to another request: {line}");
    if let Request::Apply { config, source, .. } = request
        && let Ok(doc) = Document::parse(&source, config)
    {
        let _ = doc.desired_state();
    }
});
