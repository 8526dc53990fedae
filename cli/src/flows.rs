//! `lbctl flows`: one flow's way through the balancer, a VIP's connection-table entries,
//! and purging a drained or removed backend's entries.

use std::net::{IpAddr, SocketAddr};

use clap::Subcommand;

use super::{
    OutputArgs,
    table::{Align, Table},
};
use spillway_api::flows::{DEFAULT_FLOW_LIST, FlowAnswer, FlowList, MAX_FLOW_LIST, PurgeReport};
use spillway_model::Vip;

pub const FLOWS_HELP: &str = "\
Examples:
  lbctl flows get --vip 10.0.0.1:80/tcp 198.51.100.7:40312
  lbctl flows list --vip 10.0.0.1:80/tcp --backend 10.0.1.1 --limit 20
  lbctl flows purge --backend 10.0.1.1      # only once it is drained or removed

Answers come from the maps the data path reads, with the same flow hash.";

pub const FLOWS_GET_HELP: &str = "\
Examples:
  lbctl flows get --vip 10.0.0.1:80/tcp 198.51.100.7:40312
  lbctl flows get --vip 10.0.0.2:0/udp 198.51.100.7:5000 --port 53 -o json

Says where the client's flow goes now and why: its connection-table entry
(backend, idle time, whether the data path still follows it), the Maglev slot
and backend a new flow on the tuple gets (a TCP SYN always goes there), and
whether a rule, the per-source limit or the VIP budget would refuse a new flow.

JSON output (-o json):
  {\"vip\":\"10.0.0.1:80/tcp\",\"client\":\"198.51.100.7:40312\",\"port\":80,
   \"entry\":{\"backend\":\"10.0.1.1\",\"idle_ms\":420,\"in_force\":true},
   \"hash\":3735928559,\"slot\":4711,\"maglev\":\"10.0.1.2\",\"goes_to\":\"10.0.1.1\",
   \"admission\":{\"admitted\":false,\"refused_by\":\"drop_rule_block\",
                 \"rule\":\"198.51.100.0/24 on every VIP\"}}
  entry is absent without one; stale says why an entry is not followed. goes_to
  is where the next packet (not a SYN) goes; absent: it would be dropped. With
  observe, refused_by names what would refuse it in enforce mode.";

pub const FLOWS_LIST_HELP: &str = "\
Examples:
  lbctl flows list --vip 10.0.0.1:80/tcp
  lbctl flows list --vip 10.0.0.1:80/tcp --backend 10.0.1.1 --limit 1000 -o json

Lists connection-table entries the data path follows for the VIP (entries of
removed backends and idle ones are not followed, and not listed). The walk
stops after --limit entries (at most 10000); truncated says more matched.

Columns: CLIENT (the client's address), PORT (its source port), BACKEND (where
the entry sends it), IDLE MS (milliseconds since its last packet).

JSON output (-o json):
  {\"vip\":\"10.0.0.1:80/tcp\",\"entries\":[{\"client\":\"198.51.100.7:40312\",\"port\":80,
   \"backend\":\"10.0.1.1\",\"idle_ms\":420}],\"scanned\":5120,\"truncated\":false}";

pub const FLOWS_PURGE_HELP: &str = "\
Examples:
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl flows purge --backend 10.0.1.1

Deletes the backend's connection-table entries: its remaining connections are
placed afresh by Maglev on their next packet (for TCP that breaks them). Refused
while the backend is in service on any VIP: drain it first. For an address that
is no longer a backend, deletes every entry the data path no longer follows.";

#[derive(Debug, Subcommand)]
pub enum FlowsCommand {
    /// Where one client's flow goes now, and why.
    #[command(after_help = FLOWS_GET_HELP)]
    Get {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(long, value_name = "VIP")]
        vip: Vip,
        /// The client's address and source port, e.g. 198.51.100.7:40312 or [2001:db8::7]:40312.
        #[arg(value_name = "CLIENT_IP:PORT")]
        client: SocketAddr,
        /// The destination port, for a VIP that serves every port (port 0).
        #[arg(long, value_name = "PORT")]
        port: Option<u16>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// A VIP's connection-table entries.
    #[command(after_help = FLOWS_LIST_HELP)]
    List {
        /// The VIP whose entries to list, e.g. 10.0.0.1:80/tcp.
        #[arg(long, value_name = "VIP")]
        vip: Vip,
        /// Only the entries of this backend.
        #[arg(long, value_name = "IP")]
        backend: Option<IpAddr>,
        /// Most entries to list.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_FLOW_LIST,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_FLOW_LIST)))]
        limit: u32,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Delete a drained or removed backend's connection-table entries.
    #[command(after_help = FLOWS_PURGE_HELP)]
    Purge {
        /// The backend's address (drained, or no longer a backend).
        #[arg(long, value_name = "IP")]
        backend: IpAddr,
    },
}

pub fn answer_text(a: &FlowAnswer) -> String {
    let mut lines = vec![format!("flow {} -> {} (port {})", a.client, a.vip, a.port)];
    match &a.entry {
        Some(e) => {
            let backend = e.backend.map_or_else(|| "a removed backend".to_owned(), |b| b.to_string());
            let state = match &e.stale {
                None => "followed".to_owned(),
                Some(why) => format!("not followed: {why}"),
            };
            lines.push(format!("  entry:     {backend}, idle {} ms, {state}", e.idle_ms));
        }
        None => lines.push("  entry:     none".to_owned()),
    }
    let maglev = a.maglev.map_or_else(|| "no backend".to_owned(), |b| b.to_string());
    lines.push(format!("  maglev:    slot {} (hash {:#010x}) -> {maglev}", a.slot, a.hash));
    if let Some(second) = a.second_chance {
        lines.push(format!("  second:    {second} (before the VIP's last change; a packet without an entry, not a SYN, tries both)"));
    }
    let admission = match (&a.admission.refused_by, a.admission.admitted) {
        (None, _) => "admitted".to_owned(),
        (Some(by), true) => format!("admitted (observe mode: {by} would refuse it)"),
        (Some(by), false) => format!("refused: {by}"),
    };
    lines.push(format!("  new flow:  {admission}"));
    if let Some(rule) = &a.admission.rule {
        lines.push(format!("  rule:      {rule}"));
    }
    let goes = a.goes_to.map_or_else(|| "dropped".to_owned(), |b| b.to_string());
    lines.push(format!("  next packet goes to: {goes}"));
    lines.join("\n") + "\n"
}

/// `lbctl flows list`.
pub(super) const FLOW_COLUMNS: &[(&str, Align)] =
    &[("CLIENT", Align::Left), ("PORT", Align::Right), ("BACKEND", Align::Left), ("IDLE MS", Align::Right)];

pub fn list_table(list: &FlowList) -> String {
    let mut t = Table::new(FLOW_COLUMNS);
    for e in &list.entries {
        t.row(vec![e.client.to_string(), e.port.to_string(), e.backend.to_string(), e.idle_ms.to_string()]);
    }
    let more = if list.truncated { " (more matched: raise --limit)" } else { "" };
    format!("{}{} entries of {}, {} read{more}\n", t.render(), list.entries.len(), list.vip, list.scanned)
}

pub fn purged_text(report: &PurgeReport) -> String {
    format!("purged {} connection-table entries of {} ({} read)\n", report.removed, report.backend, report.scanned)
}
