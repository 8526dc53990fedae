//! Developer tasks: `cargo xtask <test|bench|demo|soak|fuzz|architecture>`. Run them through
//! `./x`, which first installs what building needs (toolchains, LLVM, bpf-linker,
//! cargo-fuzz): cargo cannot build this crate before that.

mod architecture;
mod bench;
mod bins;
mod demo;
mod fuzz;
mod soak;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Spillway developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// The sandbox demo: real TCP through the balancer to four backends, with a backend
    /// added and another drained while traffic flows.
    Demo,
    /// Lints and runs every test (needs root).
    Test,
    /// Per-packet cost of the data path with BPF_PROG_TEST_RUN, as ratios to a trivial
    /// XDP_TX program measured in the same run.
    Bench(bench::BenchArgs),
    /// The seeded chaos soak of a fleet (needs root and BIRD 2): backends changed and
    /// flapped, lbd, BIRD and balancers killed, under traffic, with invariants checked.
    Soak(soak::SoakArgs),
    /// Runs a fuzz target of fuzz/ (or all of them) with cargo-fuzz on the pinned nightly;
    /// a crash, hang or runaway allocation fails and leaves its input in fuzz/artifacts/.
    /// `datapath` runs the balancer against its reference model instead (root).
    Fuzz(fuzz::FuzzArgs),
    /// The walls: crates depend only on lower floors, and no circle inside a crate, between
    /// files or between top-level modules.
    Architecture,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Demo => demo::run(),
        Task::Test => test::run(),
        Task::Bench(args) => bench::run(&args),
        Task::Soak(args) => soak::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::Architecture => architecture::run(),
    }
}
