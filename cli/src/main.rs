//! `lbctl`: the command line for `lbd`. See the library, `spillway_cli`.

use std::{io, process::ExitCode};

use clap::Parser;
use spillway_cli::{self as cli, Cli, Command, Outcome};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli::run(&cli, &mut io::stdout().lock()) {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Differs | Outcome::NoReport) => ExitCode::from(1),
        Ok(Outcome::Refused) => ExitCode::from(3),
        Err(e) => {
            eprintln!("lbctl: {:#}", anyhow::Error::new(e));
            // diff(1)'s convention: 1 means "differs", so trouble is 2.
            ExitCode::from(if matches!(cli.command, Command::Diff(_)) { 2 } else { 1 })
        }
    }
}
