//! How much of the kernel's verifier budget each program takes: the kernel gives up on a
//! program past 1M processed instructions, and the walk grows with the product of a path's
//! branches, not their sum, so one more branch can take a program from comfortable to
//! refused. The `verifier` test holds every program to its budget here and to the counts
//! recorded in `xdp-ebpf/verifier-counts.json`; the bench prints the counts beside it.

use aya::Ebpf;
use spillway_common::limits::program_names;

use super::{Balancer, DataplaneError, LoadOptions, load_simple};
use crate::objects;

/// The most processed instructions each program may take: `spillway_lb` [`BALANCER_GOAL`],
/// every other program 200k (docs/design/verifier-and-stack.md). Raising one is a decision,
/// not a fix: first look for the branch that multiplied the walk.
pub const BUDGETS: [(&str, u32); 16] = [
    (program_names::BALANCER, BALANCER_GOAL),
    (program_names::BALANCER_V6, 200_000),
    (program_names::BALANCER_QUIC, 200_000),
    (program_names::BALANCER_QUIC_V6, 200_000),
    (program_names::BALANCER_QUIC_CRYPT, 200_000),
    (program_names::BALANCER_QUIC_CRYPT_V6, 200_000),
    (program_names::BALANCER_UDP, 200_000),
    (program_names::BALANCER_UDP_V6, 200_000),
    (program_names::SECOND_CHANCE, 200_000),
    (program_names::PACKET_TOO_BIG, 200_000),
    (program_names::ECHO, 200_000),
    (program_names::FRAGMENT, 200_000),
    (program_names::FRAGMENT_V6, 200_000),
    (program_names::PROBE, 200_000),
    (program_names::CLOCK, 200_000),
    (program_names::DECAP, 200_000),
];

/// Where the balancer should stay: 120k of the kernel's 1M leaves headroom for the path
/// to grow.
pub const BALANCER_GOAL: u32 = 120_000;

/// Loads every program (the balancer's object with default options, and decap) and returns
/// each one's `verified_insns`, in [`BUDGETS`] order; `None` where the kernel does not
/// report it (before 5.16).
pub fn verified_insns() -> Result<Vec<(&'static str, Option<u32>)>, DataplaneError> {
    let mut balancer = Balancer::load(&LoadOptions::default())?;
    balancer.load_probe()?;
    let decap = load_simple(objects::DECAP, "spillway-decap", program_names::DECAP)?;
    let lb: &Ebpf = balancer.ebpf_mut();
    BUDGETS
        .iter()
        .map(|&(name, _)| {
            let ebpf = if name == program_names::DECAP { &decap } else { lb };
            let program = ebpf.program(name).ok_or(DataplaneError::MissingProgram { name })?;
            let info = program.info().map_err(|source| DataplaneError::Program { name, source })?;
            Ok((name, info.verified_instruction_count()))
        })
        .collect()
}
