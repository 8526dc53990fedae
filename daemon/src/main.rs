//! `lbd`: the load-balancer daemon (`lbd --iface IF`, `lbd --config FILE`), its cleanup
//! (`lbd --cleanup`) and the backend agent (`lbd agent --iface IF`). See the library,
//! `spillway_daemon`.

use std::{io, process::ExitCode};

use anyhow::Context;
use clap::CommandFactory;
use spillway_daemon::{
    self as daemon, agent,
    args::{LbdArgs, LbdCommand},
    resolve::{ArgsError, Resolved},
};
use spillway_manual as docs;

#[tokio::main]
async fn main() -> ExitCode {
    // Before logging starts: the file may set the log format. Its refusals go to stderr.
    let resolved = match daemon::resolve::resolve(std::env::args_os().collect()) {
        Ok(resolved) => resolved,
        Err(ArgsError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("lbd: {e}");
            return ExitCode::FAILURE;
        }
    };
    spillway_logging::init(resolved.args.log_format);
    match run(resolved).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(Resolved { args, config, settings }: Resolved) -> anyhow::Result<()> {
    match args.command {
        Some(LbdCommand::Agent(agent)) => {
            let iface = agent.iface.clone().context("--iface is required (on the command line or as iface in [agent])")?;
            agent::run(&agent, &iface).await.context("lbd agent")
        }
        Some(LbdCommand::Check(c)) => {
            let checked = daemon::file_check::check(&c.file).context("lbd check")?;
            println!("{}: valid ({checked})", c.file.display());
            Ok(())
        }
        Some(LbdCommand::Completions(c)) => {
            docs::completions(LbdArgs::command(), c.shell, &mut io::stdout().lock());
            Ok(())
        }
        Some(LbdCommand::Man(m)) => {
            let written = docs::man_pages(LbdArgs::command(), &m.dir).and_then(|_| docs::config_page(&m.dir));
            written.with_context(|| format!("writing man pages to {}", m.dir.display()))?;
            Ok(())
        }
        None if args.daemon.cleanup => daemon::cleanup(&args.daemon).context("lbd --cleanup"),
        None => {
            anyhow::ensure!(!args.daemon.iface.is_empty(), "--iface is required (on the command line or as iface in [lbd])");
            daemon::run(&args.daemon, config, settings).await.context("lbd")
        }
    }
}
