//! The configuration file, as `lbd --config`, `lbd check-config` and `lbctl apply` read it:
//! parsed, checked whole and turned into a desired state, or refused with a placed message.
//! What parses must survive `export`: the file `lbctl export` writes declares the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_model::config::{Document, export};

fuzz_target!(|bytes: &[u8]| {
    // `Document::read` refuses text that is not UTF-8 before parsing it.
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let Ok(doc) = Document::parse("fuzz.toml", text.to_owned()) else { return };
    let _ = doc.is_agent_only();
    let Ok(state) = doc.desired_state() else { return };
    let exported = export(&state, doc.lbd().cloned());
    let again = Document::parse("exported.toml", exported.clone()).and_then(|d| d.desired_state());
    assert_eq!(again.as_ref(), Ok(&state), "the export of a file's state declares another state:\n{exported}");
});
