//! `cargo xtask bench`: the data path's per-packet cost, measured the way Katran's reference
//! figures were: BPF_PROG_TEST_RUN with repeat = 1 called in a loop (repeat > 1 would rerun a
//! packet the program already rewrote), the kernel-measured time of each call, the thread
//! pinned to one CPU, cases alternating in chunks, the median of several repetitions.
//! Absolute times drift between runs on a VM; ratios to the floor (a trivial `XDP_TX`
//! program) measured in the same run do not, so those are what the goals are stated in.
//!
//! The bench is made of parts that each report on their own: a part that cannot run here
//! (no tracefs for the socket watcher, say) says why, and the others still run. Every result
//! is verified; performance is only reported, never asserted.

mod against;
mod control;
mod cores;
mod decap;
mod e2e;
mod katran;
mod packets;
mod paths;
mod quic;
mod scale;
mod sockwatch;
mod stages;
mod table;
mod verifier;

use anyhow::Result;
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct BenchArgs {
    /// Test runs per case per repetition.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..))]
    calls: u32,
    /// Repetitions; each case reports its median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// `json` prints only an object mapping every figure to its value (ns unless the key
    /// says otherwise), with `skipped` naming the parts that could not run and why.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// Another build's `spillway-lb` object (`target/**/bpfel-unknown-none/release/spillway-lb`
    /// of its tree) for the `against` part: both balancers measured in one run.
    #[arg(long, value_name = "OBJECT")]
    against: Option<std::path::PathBuf>,
    /// Katran's ratios to its own floor measured on this machine, back to back with the
    /// bench (`case ratio` lines; `katran.rs`), which the paths part's goals are a share of.
    /// Without it, the reference's figures from another machine.
    #[arg(long, value_name = "FILE")]
    katran: Option<std::path::PathBuf>,
    /// Run only these parts (repeatable) [default: all].
    #[arg(long = "part", value_name = "PART", value_parser = clap::builder::PossibleValuesParser::new(PARTS))]
    parts: Vec<String>,
}

/// Every part, in the order they run.
const PARTS: [&str; 12] =
    ["paths", "against", "quic", "stages", "cores", "decap", "table", "scale", "control", "e2e", "sockwatch", "verifier"];

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// What one part measured: its text, its JSON rows (name, value), and what of it could not
/// run (name, why).
#[derive(Default)]
pub struct Section {
    pub text: String,
    pub rows: Vec<(String, f64)>,
    pub skipped: Vec<(String, String)>,
}

type Part<'a> = (&'static str, Box<dyn FnOnce() -> Result<Section> + 'a>);

pub fn run(args: &BenchArgs) -> Result<()> {
    let (calls, reps) = (args.calls as usize, args.reps as usize);
    // Read first: a bad file is refused before anything is measured.
    let katran = katran::Katran::from_arg(args.katran.as_deref())?;
    let parts: Vec<Part> = vec![
        ("paths", Box::new(|| paths::part(calls, reps, &katran))),
        ("against", Box::new(|| against::part(args.against.as_deref(), calls, reps))),
        ("quic", Box::new(|| quic::part(calls, reps))),
        ("stages", Box::new(|| stages::part(calls, reps))),
        ("cores", Box::new(|| cores::part(calls, reps))),
        ("decap", Box::new(|| decap::part(calls, reps))),
        ("table", Box::new(|| table::part(calls, reps))),
        ("scale", Box::new(|| scale::part(calls, reps))),
        ("control", Box::new(control::part)),
        ("e2e", Box::new(|| e2e::part(calls, reps))),
        ("sockwatch", Box::new(|| sockwatch::part(reps))),
        ("verifier", Box::new(verifier::part)),
    ];
    let mut rows = serde_json::Map::new();
    let mut skipped = serde_json::Map::new();
    for (name, part) in parts.into_iter().filter(|(name, _)| args.parts.is_empty() || args.parts.iter().any(|p| p == name)) {
        match part() {
            Ok(section) => {
                if args.output == Format::Text {
                    println!("{}", section.text);
                }
                for (key, value) in section.rows {
                    rows.insert(key, ((value * 100.0).round() / 100.0).into());
                }
                for (key, why) in section.skipped {
                    skipped.insert(key, why.into());
                }
            }
            Err(error) => {
                let why = format!("{error:#}");
                // Said at once on stderr, so a long run shows it while the rest goes on.
                eprintln!("bench part {name} not measured: {why}");
                skipped.insert(name.to_owned(), why.into());
            }
        }
    }
    if args.output == Format::Json {
        if !skipped.is_empty() {
            rows.insert("skipped".to_owned(), skipped.into());
        }
        println!("{}", serde_json::to_string(&rows)?);
    } else if !skipped.is_empty() {
        println!("Not measured: {}", skipped.keys().cloned().collect::<Vec<_>>().join(", "));
    }
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}
