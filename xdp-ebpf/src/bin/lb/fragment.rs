//! Fragmented datagrams to UDP VIPs. Only a datagram's first fragment carries the UDP
//! header, so only it can be placed by its 5-tuple; it is placed as any packet of that flow
//! (connection table, limits, Maglev) and leaves a record of its backend under its datagram
//! (source, destination, protocol, identification: `FragmentKey`) in `spw_frags`. The later
//! fragments, which carry the same four, follow the record to the same backend, whose
//! kernel reassembles the datagram. A later fragment without a record (ahead of its first,
//! or after the record expired or was evicted) is dropped (`drop_fragment_unmatched`):
//! never sent by a guess. Fragments to a TCP VIP, or of any other protocol, are dropped as
//! before (`drop_fragment`); fragments to addresses no VIP uses pass.
//!
//! What a sender can make it hold: the records are an LRU of their own (`--max-fragments`),
//! so fragments can evict only other records, never a connection-table entry; a first
//! fragment takes a connection-table entry as an unfragmented packet of its flow would,
//! charged to the same limits; later fragments never take one. Each source (an IPv4
//! address, an IPv6 /64) records at most `FRAGMENT_SOURCE_BURST + 1` datagrams at once and
//! `FRAGMENT_SOURCE_PER_S` a second after that, and its first fragments beyond that are
//! dropped before they are placed (`drop_fragment_limited`); a record is followed for
//! `FRAGMENT_RECORD_TICKS`.
//!
//! A program of its own (`fragment_program.rs`), tail-called from the balancer's parse: the
//! path of unfragmented packets gains no instruction.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::FAMILY_V4;

use crate::maps::FRAGMENT_PROGRAM;

/// Slots of the fragment programs in their program array.
pub const FRAGMENT_V4: u32 = 0;
pub const FRAGMENT_V6: u32 = 1;

/// Tail-calls the fragment program of `FAMILY`, which parses the fragment again. Returns
/// only if it cannot run (not loaded yet, or the bench's stage builds).
#[inline(always)]
pub fn hand_over<const FAMILY: u8>(ctx: &XdpContext) {
    let slot = if FAMILY == FAMILY_V4 { FRAGMENT_V4 } else { FRAGMENT_V6 };
    // SAFETY: the slots hold XDP programs of the balancer's object, or nothing.
    let _ = unsafe { FRAGMENT_PROGRAM.tail_call(ctx, slot) };
}
