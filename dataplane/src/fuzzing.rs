//! The parsers of what the kernel answers over netlink, reachable from the fuzz target
//! (`fuzz/`, feature `fuzzing`) without a netlink socket. Nothing else calls this.

use std::collections::HashSet;
use std::fmt::Debug;

use crate::{neighbours, rtnl};

/// The request number the answers are read against.
const SEQ: u32 = 1;

/// Everything `lbd` reads from a netlink answer, run on `bytes`: the first message as the
/// answer to request [`SEQ`], its body as a link and as a route (`Rtnl::link`, `Rtnl::route`),
/// and `bytes` as one batch of a neighbour dump (`neighbours::upkeep`).
pub fn parse_netlink(bytes: &[u8]) -> impl Debug + '_ {
    let answer = rtnl::answer(bytes, SEQ);
    let (link, route) = match answer {
        rtnl::Answer::Data(body) => (rtnl::parse_link(body), rtnl::parse_route(body)),
        _ => (None, None),
    };
    let mut neighbours = HashSet::new();
    let dump_done = neighbours::parse_batch(bytes, &mut neighbours);
    (answer, link, route, dump_done, neighbours)
}
