//! Packet-level tests of the XDP programs with BPF_PROG_TEST_RUN: each test builds frames
//! (PKTGEN), fills the maps through the real reconciler (SETUP) and asserts the action,
//! the counted reason and the output bytes (CHECK). Needs root.

mod affinity;
mod backends;
mod clock;
mod decap;
mod differential;
mod echo;
mod flood;
mod forwarding;
mod fragments;
mod fuzz;
mod gue;
mod icmp;
mod limits;
mod nexthop;
mod packet_too_big;
mod pass_to;
mod passing;
mod probe;
mod quic;
mod quic_encrypted;
mod second_chance;
mod support;
