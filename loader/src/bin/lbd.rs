//! `lbd`: the load-balancer daemon (`lbd --iface IF`), its cleanup (`lbd --cleanup`) and the
//! backend agent (`lbd agent --iface IF`). See `spillway::daemon` and `spillway::agent`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use spillway::{
    agent,
    daemon::{
        self,
        args::{LbdArgs, LbdCommand},
    },
};

#[tokio::main]
async fn main() -> ExitCode {
    let args = LbdArgs::parse();
    spillway::logging::init(args.log_format);
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: LbdArgs) -> anyhow::Result<()> {
    match args.command {
        Some(LbdCommand::Agent(agent)) => agent::run(&agent).await.context("lbd agent"),
        None if args.daemon.cleanup => daemon::cleanup(&args.daemon).context("lbd --cleanup"),
        None => {
            let iface = args.daemon.iface.as_deref().context("--iface is required")?;
            daemon::run(&args.daemon, iface).await.context("lbd")
        }
    }
}
