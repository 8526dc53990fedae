//! `lbctl`: the command line for `lbd`. See `spillway::cli`.

use std::{io, process::ExitCode};

use clap::Parser;
use spillway::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli::run(&cli, &mut io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lbctl: {:#}", anyhow::Error::new(e));
            ExitCode::FAILURE
        }
    }
}
