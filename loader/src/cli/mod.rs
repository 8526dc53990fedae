//! `lbctl`: the command line over `lbd`'s API. Parsing, the request each command sends and
//! the rendering of replies live here so they can be tested without a daemon.

mod render;
mod table;

use std::{io, net::IpAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use spillway_common::maglev::MAX_WEIGHT;

use crate::{
    api::{
        DEFAULT_SOCKET, Request,
        client::{self, ClientError},
    },
    model::{DEFAULT_WEIGHT, Vip},
};

const LBCTL_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl stats -o json

lbctl talks to lbd through its API socket and must run as root. A VIP is
<IP>:<PORT>/<tcp|udp>; port 0 means every port; IPv6 as [fd00::1]:443/tcp.";

const VIPS_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl vips list -o json
  lbctl vips remove 10.0.0.1:80/tcp";

const VIPS_ADD_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl vips add 10.0.0.2:0/udp                       # every UDP port of 10.0.0.2
  lbctl vips add '[fd00::1]:443/tcp' --ring-size 4099";

const VIPS_LIST_HELP: &str = "\
Example:
  lbctl vips list -o json

JSON output (-o json):
  {\"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"ring_size\":65537,\"backends\":2}]}
  backends counts every backend of the VIP, draining ones included.";

const VIPS_REMOVE_HELP: &str = "\
Example:
  lbctl vips remove 10.0.0.1:80/tcp";

const BACKENDS_HELP: &str = "\
Examples:
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1 --weight 50
  lbctl backends list --vip 10.0.0.1:80/tcp
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1";

const BACKENDS_ADD_HELP: &str = "\
Examples:
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.2 --weight 50
  lbctl backends add --vip '[fd00::1]:443/tcp' fd00:1::1";

const BACKENDS_LIST_HELP: &str = "\
Example:
  lbctl backends list --vip 10.0.0.1:80/tcp -o json

JSON output (-o json):
  {\"vip\":\"10.0.0.1:80/tcp\",
   \"backends\":[{\"address\":\"10.0.1.1\",\"weight\":100,\"state\":\"active\"}]}
  state is \"active\" or \"draining\" (weight 0).";

const BACKENDS_REMOVE_HELP: &str = "\
Example:
  lbctl backends remove --vip 10.0.0.1:80/tcp 10.0.1.1

Connections pinned to a removed backend move to another one; drain first to let
them finish.";

const BACKENDS_DRAIN_HELP: &str = "\
Example:
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1

Sets the weight to 0: existing connections stay on the backend, new ones go
elsewhere. Undo with set-weight.";

const BACKENDS_SET_WEIGHT_HELP: &str = "\
Example:
  lbctl backends set-weight --vip 10.0.0.1:80/tcp 10.0.1.1 200";

const STATS_HELP: &str = "\
Example:
  lbctl stats -o json

JSON output (-o json):
  {\"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"packets\":10,\"bytes\":1500,
             \"backends\":[{\"address\":\"10.0.1.1\",\"packets\":10,\"bytes\":1500}]}],
   \"reasons\":[{\"reason\":\"tx\",\"packets\":10}, ...]}
  reasons lists every verdict of the balancer, each packet counted under one.";

#[derive(Debug, Parser)]
#[command(name = "lbctl", version, about = "Control Spillway's load balancer (lbd)", after_help = LBCTL_HELP)]
pub struct Cli {
    /// lbd's API socket.
    #[arg(long, global = true, value_name = "PATH", env = "SPILLWAY_API", default_value = DEFAULT_SOCKET)]
    pub api: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Add, list and remove virtual services.
    #[command(subcommand, after_help = VIPS_HELP)]
    Vips(VipsCommand),
    /// Add, list, drain, reweight and remove the backends of a VIP.
    #[command(subcommand, after_help = BACKENDS_HELP)]
    Backends(BackendsCommand),
    /// Packet and byte counters per VIP and backend, and per verdict.
    #[command(after_help = STATS_HELP)]
    Stats(OutputArgs),
}

#[derive(Debug, Subcommand)]
pub enum VipsCommand {
    /// Add a VIP (no backends yet: its packets are dropped until one is added).
    #[command(after_help = VIPS_ADD_HELP)]
    Add {
        #[arg(value_name = "VIP")]
        vip: Vip,
        /// Maglev table size: a prime from 13 to 65537 [default: 65537].
        #[arg(long, value_name = "PRIME")]
        ring_size: Option<u32>,
    },
    /// List the VIPs.
    #[command(after_help = VIPS_LIST_HELP)]
    List(OutputArgs),
    /// Remove a VIP and all its backends.
    #[command(after_help = VIPS_REMOVE_HELP)]
    Remove {
        #[arg(value_name = "VIP")]
        vip: Vip,
    },
}

#[derive(Debug, Subcommand)]
pub enum BackendsCommand {
    /// Add a backend to a VIP.
    #[command(after_help = BACKENDS_ADD_HELP)]
    Add {
        #[command(flatten)]
        target: Target,
        /// Share of new flows relative to the VIP's other backends.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_WEIGHT, value_parser = weight())]
        weight: u32,
    },
    /// List a VIP's backends.
    #[command(after_help = BACKENDS_LIST_HELP)]
    List {
        #[arg(long, value_name = "VIP")]
        vip: Vip,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Remove a backend from a VIP.
    #[command(after_help = BACKENDS_REMOVE_HELP)]
    Remove {
        #[command(flatten)]
        target: Target,
    },
    /// Stop sending new flows to a backend; its existing flows stay.
    #[command(after_help = BACKENDS_DRAIN_HELP)]
    Drain {
        #[command(flatten)]
        target: Target,
    },
    /// Change a backend's weight (also undoes a drain).
    #[command(after_help = BACKENDS_SET_WEIGHT_HELP)]
    SetWeight {
        #[command(flatten)]
        target: Target,
        #[arg(value_name = "N", value_parser = weight())]
        weight: u32,
    },
}

/// A backend of a VIP.
#[derive(Debug, Args)]
pub struct Target {
    /// The VIP, e.g. 10.0.0.1:80/tcp.
    #[arg(long, value_name = "VIP")]
    pub vip: Vip,
    /// The backend's address.
    #[arg(value_name = "IP")]
    pub backend: IpAddr,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// JSON with stable field names (see each command's help).
    Json,
}

fn weight() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(MAX_WEIGHT))
}

impl Command {
    /// The API request this command sends.
    pub fn request(&self) -> Request {
        match self {
            Command::Vips(VipsCommand::Add { vip, ring_size }) => Request::AddVip { vip: *vip, ring_size: *ring_size },
            Command::Vips(VipsCommand::List(_)) => Request::ListVips,
            Command::Vips(VipsCommand::Remove { vip }) => Request::RemoveVip { vip: *vip },
            Command::Backends(BackendsCommand::Add { target, weight }) => {
                Request::AddBackend { vip: target.vip, backend: target.backend, weight: Some(*weight) }
            }
            Command::Backends(BackendsCommand::List { vip, .. }) => Request::ListBackends { vip: *vip },
            Command::Backends(BackendsCommand::Remove { target }) => Request::RemoveBackend { vip: target.vip, backend: target.backend },
            Command::Backends(BackendsCommand::Drain { target }) => Request::DrainBackend { vip: target.vip, backend: target.backend },
            Command::Backends(BackendsCommand::SetWeight { target, weight }) => {
                Request::SetWeight { vip: target.vip, backend: target.backend, weight: *weight }
            }
            Command::Stats(_) => Request::Stats,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("writing the output")]
    Output(#[from] io::Error),
    #[error("lbd sent a reply that does not fit the command; are lbd and lbctl the same version?")]
    UnexpectedReply,
}

/// Sends the command's request to lbd and writes the answer to `out`.
pub fn run(cli: &Cli, out: &mut dyn io::Write) -> Result<(), CliError> {
    let reply = client::call(&cli.api, &cli.command.request())?;
    render::reply(&cli.command, reply, out)
}

#[cfg(test)]
mod tests;
