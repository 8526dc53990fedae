//! Turns lbd's replies into `lbctl` output: a confirmation line for changes, tables or JSON
//! for listings.

use std::io::Write;

use serde::Serialize;

use super::{
    BackendsCommand, CliError, Command, Format, Outcome, RatelimitCommand, RulesCommand, ScopeArgs, VipsCommand, config_file,
    flows::{self, FlowsCommand},
    render_health,
    table::{Align, Table},
};
use spillway_api::{BudgetLimit, LimitOrigin, PerSourceLimit, RateLimitList, Reply, RuleList, Stats, TopSourceList};
use spillway_model::{RateSpec, Vip};

pub fn reply(command: &Command, reply: Reply, out: &mut dyn Write) -> Result<Outcome, CliError> {
    let mut outcome = Outcome::Done;
    let text = match (command, reply) {
        (Command::Apply(a), Reply::Applied(applied)) => {
            let wrote = applied.applied.then(|| config_file::write_starts(&a.file, &applied.started)).flatten();
            let text = output(a.output.output, &applied, config_file::applied_text)?;
            // JSON stays one document: the starts are in it.
            match (a.output.output, wrote) {
                (Format::Table, Some(wrote)) => text + &wrote,
                _ => text,
            }
        }
        (Command::Diff(a), Reply::Applied(applied)) => {
            if applied.changes.iter().any(|c| c.refused.is_some()) {
                outcome = Outcome::Refused;
            } else if !applied.changes.is_empty() || !applied.notes.is_empty() {
                outcome = Outcome::Differs;
            }
            output(a.output.output, &applied, config_file::applied_text)?
        }
        (Command::Export, Reply::Exported(exported)) => exported.config,
        (Command::Status(o), Reply::Status(status)) => output(o.output, &*status, config_file::status_text)?,
        (Command::Vips(VipsCommand::List(o)), Reply::Vips(list)) => output(o.output, &list, render_health::vips_table)?,
        (Command::Backends(BackendsCommand::List { output: o, .. }), Reply::Backends(list)) => {
            output(o.output, &list, render_health::backends_table)?
        }
        (Command::Stats(o), Reply::Stats(stats)) => output(o.output, &stats, stats_tables)?,
        (Command::Ratelimit(RatelimitCommand::List(o)), Reply::RateLimits(list)) => output(o.output, &list, rate_limits_table)?,
        (Command::Rules(RulesCommand::List(o)), Reply::Rules(list)) => output(o.output, &list, rules_table)?,
        (Command::TopSources { output: o, .. }, Reply::TopSources(list)) => output(o.output, &list, top_sources_table)?,
        (Command::Ports { output: o, .. }, Reply::Ports(view)) => {
            if view.report.is_none() {
                outcome = Outcome::NoReport;
            }
            output(o.output, view.as_ref(), render_health::ports_tables)?
        }
        (Command::Flows(FlowsCommand::Get { output: o, .. }), Reply::Flow(answer)) => output(o.output, &answer, flows::answer_text)?,
        (Command::Flows(FlowsCommand::List { output: o, .. }), Reply::Flows(list)) => output(o.output, &list, flows::list_table)?,
        (Command::Flows(FlowsCommand::Purge { .. }), Reply::Purged(report)) => flows::purged_text(&report),
        (command, Reply::Done { .. }) => done(command).ok_or(CliError::UnexpectedReply)?,
        _ => return Err(CliError::UnexpectedReply),
    };
    out.write_all(text.as_bytes())?;
    Ok(outcome)
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
        Command::Vips(VipsCommand::Remove { vip, .. }) => format!("removed VIP {vip} and its backends"),
        Command::Vips(VipsCommand::Encap { vip, encap }) => format!("VIP {vip}: backends without their own encap now take {encap}"),
        Command::Vips(VipsCommand::QuicNext { vip, .. }) => {
            format!("VIP {vip}: a second QUIC-LB config id, decoded beside the current one")
        }
        Command::Vips(VipsCommand::QuicRetire { vip }) => format!("VIP {vip}: the second QUIC-LB config id is now its only one"),
        Command::Backends(BackendsCommand::Add { target, weight, .. }) => {
            format!("added backend {} to {} (weight {weight})", target.backend, target.vip)
        }
        Command::Backends(BackendsCommand::Options { target, .. }) => {
            format!("set the options of backend {} in {}", target.backend, target.vip)
        }
        Command::Vips(VipsCommand::Health { vip, health }) if health.reset => format!("reset the health checks of {vip}"),
        Command::Vips(VipsCommand::Health { vip, .. }) => format!("changed the health checks of {vip}"),
        Command::Backends(BackendsCommand::Remove { target }) => format!("removed backend {} from {}", target.backend, target.vip),
        Command::Backends(BackendsCommand::Drain { target, deadline, force }) => {
            let removal = deadline.map_or_else(String::new, |s| format!("; removed in {s} s"));
            // lbd refuses the last active backend without --force: with it, there may be no elsewhere.
            let elsewhere =
                if *force { "new flows go to its other active backends, and fail if it has none" } else { "new flows go elsewhere" };
            format!("draining backend {} of {}: existing flows stay, {elsewhere}{removal}", target.backend, target.vip)
        }
        Command::Backends(BackendsCommand::SetWeight { target, weight }) => {
            format!("set the weight of backend {} in {} to {weight}", target.backend, target.vip)
        }
        Command::Ratelimit(RatelimitCommand::Set { scope, per_source, burst, source_prefix_v4, source_prefix_v6, observe }) => {
            let rate = RateSpec::new(*per_source, burst.burst);
            format!(
                "set the per-source limit of {} to {rate} per /{} (IPv4) or /{} (IPv6) source prefix{}",
                scope_text(scope),
                source_prefix_v4.unwrap_or(spillway_common::limits::DEFAULT_SOURCE_PREFIX_V4),
                source_prefix_v6.unwrap_or(spillway_common::limits::DEFAULT_SOURCE_PREFIX_V6),
                observe_text(*observe)
            )
        }
        Command::Ratelimit(RatelimitCommand::Budget { scope, new_flows, burst, observe }) => {
            let rate = RateSpec::new(*new_flows, burst.burst);
            format!("set the new-flow budget of {} to {rate}{}", scope_text(scope), observe_text(*observe))
        }
        Command::Ratelimit(RatelimitCommand::Clear { scope, per_source, budget }) => {
            let part = match (per_source, budget) {
                (true, _) => "the per-source limit",
                (false, true) => "the new-flow budget",
                (false, false) => "the per-source limit and the new-flow budget",
            };
            format!("cleared {part} of {}", scope_text(scope))
        }
        Command::Rules(RulesCommand::Add { cidr, vip, action, burst, observe }) => {
            let what = match action.limit {
                Some(per_s) => format!("limit to {}", RateSpec::new(per_s, *burst)),
                None if action.block => "block".to_owned(),
                None => "exempt".to_owned(),
            };
            format!("rule {cidr} on {}: {what}{}", vip_text(vip), observe_text(*observe))
        }
        Command::Rules(RulesCommand::Remove { cidr, vip }) => format!("removed the rule {cidr} on {}", vip_text(vip)),
        Command::Vips(VipsCommand::List(_))
        | Command::Backends(BackendsCommand::List { .. })
        | Command::Stats(_)
        | Command::Ratelimit(RatelimitCommand::List(_))
        | Command::Rules(RulesCommand::List(_))
        | Command::TopSources { .. }
        | Command::Top(_)
        | Command::Flows(_)
        | Command::Ports { .. }
        | Command::Apply(_)
        | Command::Diff(_)
        | Command::Export
        | Command::Status(_)
        | Command::Completions(_)
        | Command::Man(_) => return None,
    };
    Some(line + "\n")
}

fn scope_text(scope: &ScopeArgs) -> String {
    match &scope.vip {
        Some(vip) => format!("VIP {vip}"),
        None => "the default (every VIP without its own)".to_owned(),
    }
}

fn vip_text(vip: &Option<Vip>) -> String {
    match vip {
        Some(vip) => format!("VIP {vip}"),
        None => "every VIP".to_owned(),
    }
}

fn observe_text(observe: bool) -> &'static str {
    if observe { " (observe: counted, nothing dropped)" } else { "" }
}

/// `lbctl stats`: per VIP.
pub(super) const STATS_VIP_COLUMNS: &[(&str, Align)] = &[("VIP", Align::Left), ("PACKETS", Align::Right), ("BYTES", Align::Right)];

/// `lbctl stats`: per backend.
pub(super) const STATS_BACKEND_COLUMNS: &[(&str, Align)] =
    &[("VIP", Align::Left), ("BACKEND", Align::Left), ("PACKETS", Align::Right), ("BYTES", Align::Right)];

/// `lbctl stats`: per verdict.
pub(super) const STATS_REASON_COLUMNS: &[(&str, Align)] = &[("REASON", Align::Left), ("PACKETS", Align::Right)];

/// `lbctl stats`: what observe mode would drop.
pub(super) const STATS_OBSERVED_COLUMNS: &[(&str, Align)] = &[("OBSERVED", Align::Left), ("PACKETS", Align::Right)];

/// `lbctl stats`: how QUIC short headers were placed.
pub(super) const STATS_QUIC_COLUMNS: &[(&str, Align)] = &[("QUIC", Align::Left), ("PACKETS", Align::Right)];

/// `lbctl ratelimit list`.
pub(super) const RATE_LIMIT_COLUMNS: &[(&str, Align)] =
    &[("SCOPE", Align::Left), ("PER_SOURCE", Align::Left), ("SOURCE_PREFIX", Align::Left), ("BUDGET", Align::Left)];

/// `lbctl rules list`.
pub(super) const RULE_COLUMNS: &[(&str, Align)] = &[
    ("CIDR", Align::Left),
    ("VIP", Align::Left),
    ("ACTION", Align::Left),
    ("RATE", Align::Left),
    ("OBSERVE", Align::Left),
    ("HITS", Align::Right),
    ("DROPPED", Align::Right),
    ("WOULD-DROP", Align::Right),
];

/// `lbctl top-sources`.
pub(super) const TOP_SOURCE_COLUMNS: &[(&str, Align)] = &[("PREFIX", Align::Left), ("ADMITTED", Align::Right), ("DROPPED", Align::Right)];

fn stats_tables(stats: &Stats) -> String {
    let mut vips = Table::new(STATS_VIP_COLUMNS);
    let mut backends = Table::new(STATS_BACKEND_COLUMNS);
    for v in &stats.vips {
        vips.row(vec![v.vip.to_string(), v.packets.to_string(), v.bytes.to_string()]);
        for b in &v.backends {
            backends.row(vec![v.vip.to_string(), b.address.to_string(), b.packets.to_string(), b.bytes.to_string()]);
        }
    }
    let mut reasons = Table::new(STATS_REASON_COLUMNS);
    for r in &stats.reasons {
        reasons.row(vec![r.reason.clone(), r.packets.to_string()]);
    }
    let mut observed = Table::new(STATS_OBSERVED_COLUMNS);
    for o in &stats.observed {
        observed.row(vec![o.reason.clone(), o.packets.to_string()]);
    }
    let mut quic = Table::new(STATS_QUIC_COLUMNS);
    for q in &stats.quic {
        quic.row(vec![q.reason.clone(), q.packets.to_string()]);
    }
    let alerts: String = stats.alerts.iter().map(|a| format!("{a}\n")).collect();
    alerts + &[vips.render(), backends.render(), reasons.render(), observed.render(), quic.render()].join("\n")
}

/// `100/s burst 200`, then ` observe` and ` (default)` when they apply.
fn limit_cell(rate: &RateSpec, observe: bool, from: LimitOrigin) -> String {
    let mut cell = rate.to_string();
    if observe {
        cell.push_str(" observe");
    }
    if from == LimitOrigin::Default {
        cell.push_str(" (default)");
    }
    cell
}

fn rate_limits_table(list: &RateLimitList) -> String {
    let mut t = Table::new(RATE_LIMIT_COLUMNS);
    let mut row = |scope: String, per_source: &Option<PerSourceLimit>, budget: &Option<BudgetLimit>, is_default: bool| {
        // The default's own row does not say "(default)" on every cell.
        let from = |f: LimitOrigin| if is_default { LimitOrigin::Vip } else { f };
        let (per_source, prefix) = match per_source {
            Some(p) => (limit_cell(&p.rate, p.observe, from(p.from)), format!("/{} /{}", p.source_prefix_v4, p.source_prefix_v6)),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let budget = budget.as_ref().map_or("-".to_owned(), |b| limit_cell(&b.rate, b.observe, from(b.from)));
        t.row(vec![scope, per_source, prefix, budget]);
    };
    row("default".to_owned(), &list.default.per_source, &list.default.vip_budget, true);
    for v in &list.vips {
        row(v.vip.to_string(), &v.effective.per_source, &v.effective.vip_budget, false);
    }
    t.render()
}

fn rules_table(list: &RuleList) -> String {
    let mut t = Table::new(RULE_COLUMNS);
    for r in &list.rules {
        t.row(vec![
            r.cidr.to_string(),
            r.vip.map_or("*".to_owned(), |v| v.to_string()),
            r.action.label().to_owned(),
            r.rate.map_or("-".to_owned(), |rate| rate.to_string()),
            if r.observe { "yes" } else { "no" }.to_owned(),
            r.hits.to_string(),
            // Apart: a rule observed, then enforced, dropped only what it dropped since.
            r.dropped.to_string(),
            r.would_drop.to_string(),
        ]);
    }
    t.render()
}

fn top_sources_table(list: &TopSourceList) -> String {
    let mut t = Table::new(TOP_SOURCE_COLUMNS);
    for s in &list.sources {
        // `~`: an estimate from a 1-in-16 sample.
        let count = |n: u64| if s.estimated { format!("~{n}") } else { n.to_string() };
        t.row(vec![s.prefix.to_string(), count(s.admitted), count(s.dropped)]);
    }
    t.render()
}
