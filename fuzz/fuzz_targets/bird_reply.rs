//! BIRD's control-socket answers, as `lbd`'s announcer reads them: a reply's lines (codes,
//! continuations, at most `MAX_REPLY` bytes), then the routes of a `show route ... all`.
#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use spillway_announce::bird::{parse_routes, read_reply};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(lines) = read_reply(&mut &bytes[..]) {
        black_box(parse_routes(&lines));
    }
});
