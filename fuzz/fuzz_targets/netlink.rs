//! What the kernel answers over rtnetlink, as `lbd` reads it: a request's answer (ack,
//! error, data), a link, a route, a batch of the neighbour dump. The kernel is trusted, but
//! a parser that panics on a message it did not expect takes `lbd` down with it.
#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use spillway_dataplane::fuzzing::parse_netlink;

fuzz_target!(|bytes: &[u8]| {
    black_box(parse_netlink(bytes));
});
