//! Turns lbd's replies into `lbctl` output: a confirmation line for changes, tables or JSON
//! for listings.

use std::io::Write;

use serde::Serialize;

use super::{
    BackendsCommand, CliError, Command, Format, VipsCommand,
    table::{Align, Table},
};
use crate::api::{BackendList, Reply, Stats, VipList};

pub fn reply(command: &Command, reply: Reply, out: &mut dyn Write) -> Result<(), CliError> {
    let text = match (command, reply) {
        (Command::Vips(VipsCommand::List(o)), Reply::Vips(list)) => output(o.output, &list, vips_table)?,
        (Command::Backends(BackendsCommand::List { output: o, .. }), Reply::Backends(list)) => output(o.output, &list, backends_table)?,
        (Command::Stats(o), Reply::Stats(stats)) => output(o.output, &stats, stats_tables)?,
        (command, Reply::Done { .. }) => done(command).ok_or(CliError::UnexpectedReply)?,
        _ => return Err(CliError::UnexpectedReply),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

fn output<T: Serialize>(format: Format, value: &T, table: fn(&T) -> String) -> Result<String, CliError> {
    Ok(match format {
        Format::Table => table(value),
        Format::Json => {
            let mut json = serde_json::to_string_pretty(value).map_err(std::io::Error::from)?;
            json.push('\n');
            json
        }
    })
}

/// The confirmation line of a change.
fn done(command: &Command) -> Option<String> {
    let line = match command {
        Command::Vips(VipsCommand::Add { vip, .. }) => format!("added VIP {vip}"),
        Command::Vips(VipsCommand::Remove { vip }) => format!("removed VIP {vip} and its backends"),
        Command::Backends(BackendsCommand::Add { target, weight }) => {
            format!("added backend {} to {} (weight {weight})", target.backend, target.vip)
        }
        Command::Backends(BackendsCommand::Remove { target }) => format!("removed backend {} from {}", target.backend, target.vip),
        Command::Backends(BackendsCommand::Drain { target }) => {
            format!("draining backend {} of {}: existing flows stay, new flows go elsewhere", target.backend, target.vip)
        }
        Command::Backends(BackendsCommand::SetWeight { target, weight }) => {
            format!("set the weight of backend {} in {} to {weight}", target.backend, target.vip)
        }
        Command::Vips(VipsCommand::List(_)) | Command::Backends(BackendsCommand::List { .. }) | Command::Stats(_) => return None,
    };
    Some(line + "\n")
}

fn vips_table(list: &VipList) -> String {
    let mut t = Table::new(&[("VIP", Align::Left), ("RING_SIZE", Align::Right), ("BACKENDS", Align::Right)]);
    for v in &list.vips {
        t.row(vec![v.vip.to_string(), v.ring_size.to_string(), v.backends.to_string()]);
    }
    t.render()
}

fn backends_table(list: &BackendList) -> String {
    let mut t = Table::new(&[("BACKEND", Align::Left), ("WEIGHT", Align::Right), ("STATE", Align::Left)]);
    for b in &list.backends {
        t.row(vec![b.address.to_string(), b.weight.to_string(), b.state.label().to_owned()]);
    }
    t.render()
}

fn stats_tables(stats: &Stats) -> String {
    let mut vips = Table::new(&[("VIP", Align::Left), ("PACKETS", Align::Right), ("BYTES", Align::Right)]);
    let mut backends = Table::new(&[("VIP", Align::Left), ("BACKEND", Align::Left), ("PACKETS", Align::Right), ("BYTES", Align::Right)]);
    for v in &stats.vips {
        vips.row(vec![v.vip.to_string(), v.packets.to_string(), v.bytes.to_string()]);
        for b in &v.backends {
            backends.row(vec![v.vip.to_string(), b.address.to_string(), b.packets.to_string(), b.bytes.to_string()]);
        }
    }
    let mut reasons = Table::new(&[("REASON", Align::Left), ("PACKETS", Align::Right)]);
    for r in &stats.reasons {
        reasons.row(vec![r.reason.clone(), r.packets.to_string()]);
    }
    [vips.render(), backends.render(), reasons.render()].join("\n")
}
