//! `lbctl top`: a live view of the balancer from two samples a second apart (rates are
//! counter deltas over the time between them). On a terminal it redraws in place; piped,
//! it prints one snapshot per interval; `--once -o json` prints one machine-readable one.

use std::{io::Write, path::Path, time::Duration};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{
    CliError, Format,
    table::{Align, Table},
};
use spillway_api::{
    BackendState, Reply, Request,
    client::{self},
    sample::Sample,
};

pub const TOP_HELP: &str = "\
Examples:
  lbctl top                       # redraws every second; q or Ctrl-C to quit
  lbctl top --count 5 | tee top.log
  lbctl top --once -o json

Per VIP: packets/s, new flows/s and dropped packets/s (the VIP's packets that were
not forwarded); per backend: its share of the VIP's new flows, health and weights;
and drops/s by reason over the whole balancer (the data path counts reasons
globally). Rates are counter deltas between two samples, --interval apart.

Columns, per VIP: VIP, PACKETS/S, NEW FLOWS/S, DROPPED/S, PANIC (PANIC or -);
per backend: BACKEND, SHARE (of the VIP's new flows), NEW FLOWS/S, PACKETS/S,
STATE (active, or draining: existing flows only), HEALTH (as in backends list),
WEIGHT (the operator's, as in backends list: a drain sets it to 0, and
backends set-weight gives it back) and EFFECTIVE (the one in use).

JSON output (-o json), one object per sample:
  {\"interval_s\":1.0,
   \"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"packets_per_s\":2000.0,\"new_flows_per_s\":200.0,
             \"dropped_per_s\":0.0,\"panic\":false,
             \"backends\":[{\"address\":\"10.0.1.1\",\"new_flows_per_s\":100.0,\"share\":0.5,
                           \"packets_per_s\":1000.0,\"state\":\"active\",\"health\":\"healthy\",
                           \"weight\":100,\"effective_weight\":100}]}],
   \"drops_per_s\":[{\"reason\":\"drop_no_backend\",\"per_s\":0.0}, ...]}";

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between samples.
    #[arg(long, value_name = "S", default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Print one sample (after one interval) and exit.
    #[arg(long, conflicts_with = "count")]
    pub once: bool,
    /// Print this many samples and exit [default: until interrupted].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    #[command(flatten)]
    pub output: super::OutputArgs,
}

fn parse_interval(input: &str) -> Result<f64, String> {
    match input.parse::<f64>() {
        Ok(s) if (0.1..=60.0).contains(&s) => Ok(s),
        _ => Err("expected seconds between 0.1 and 60".to_owned()),
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopView {
    pub interval_s: f64,
    pub vips: Vec<VipRates>,
    /// Every drop reason of the data path, per second.
    pub drops_per_s: Vec<ReasonRate>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipRates {
    pub vip: String,
    pub packets_per_s: f64,
    pub new_flows_per_s: f64,
    /// The VIP's packets that were not forwarded to a backend.
    pub dropped_per_s: f64,
    pub panic: bool,
    pub backends: Vec<BackendRates>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendRates {
    pub address: String,
    pub new_flows_per_s: f64,
    /// Its share of the VIP's new flows in the interval (0 when there were none).
    pub share: f64,
    pub packets_per_s: f64,
    /// Draining (the operator's weight is 0) or active, as `backends list` says.
    pub state: BackendState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    pub weight: u32,
    pub effective_weight: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReasonRate {
    pub reason: String,
    pub per_s: f64,
}

/// Rates between two samples (a counter that went back, a reused id, counts from zero).
pub fn rates(before: &Sample, after: &Sample) -> TopView {
    let seconds = (after.at_ms.saturating_sub(before.at_ms) as f64 / 1000.0).max(0.001);
    let rate = |now: u64, then: Option<u64>| now.saturating_sub(then.unwrap_or(0)) as f64 / seconds;
    let vips = after
        .vips
        .iter()
        .map(|v| {
            let old = before.vips.iter().find(|o| o.vip == v.vip);
            let new_flows = rate(v.new_flows, old.map(|o| o.new_flows));
            let packets = rate(v.packets, old.map(|o| o.packets));
            let backends: Vec<BackendRates> = v
                .backends
                .iter()
                .map(|b| {
                    let old = old.and_then(|o| o.backends.iter().find(|ob| ob.address == b.address));
                    let flows = rate(b.new_flows, old.map(|o| o.new_flows));
                    BackendRates {
                        address: b.address.to_string(),
                        new_flows_per_s: flows,
                        share: if new_flows > 0.0 { flows / new_flows } else { 0.0 },
                        packets_per_s: rate(b.packets, old.map(|o| o.packets)),
                        state: BackendState::of_weight(b.weight),
                        health: b.health.clone(),
                        weight: b.weight,
                        effective_weight: b.effective_weight,
                    }
                })
                .collect();
            let forwarded: f64 = backends.iter().map(|b| b.packets_per_s).sum();
            VipRates {
                vip: v.vip.to_string(),
                packets_per_s: packets,
                new_flows_per_s: new_flows,
                dropped_per_s: (packets - forwarded).max(0.0),
                panic: v.health.as_ref().is_some_and(|h| h.panic),
                backends,
            }
        })
        .collect();
    let drops_per_s = after
        .reasons
        .iter()
        .filter(|r| r.reason.starts_with("drop_"))
        .map(|r| ReasonRate {
            reason: r.reason.clone(),
            per_s: rate(r.packets, before.reasons.iter().find(|o| o.reason == r.reason).map(|o| o.packets)),
        })
        .collect();
    TopView { interval_s: seconds, vips, drops_per_s }
}

/// `lbctl top`: per VIP.
pub(super) const TOP_VIP_COLUMNS: &[(&str, Align)] = &[
    ("VIP", Align::Left),
    ("PACKETS/S", Align::Right),
    ("NEW FLOWS/S", Align::Right),
    ("DROPPED/S", Align::Right),
    ("PANIC", Align::Left),
];

/// `lbctl top`: per backend of a VIP.
pub(super) const TOP_BACKEND_COLUMNS: &[(&str, Align)] = &[
    ("  BACKEND", Align::Left),
    ("SHARE", Align::Right),
    ("NEW FLOWS/S", Align::Right),
    ("PACKETS/S", Align::Right),
    ("STATE", Align::Left),
    ("HEALTH", Align::Left),
    ("WEIGHT", Align::Right),
    ("EFFECTIVE", Align::Right),
];

/// The view as `lbctl top` shows it: a VIP table, a backend table per VIP, drops.
pub fn render(view: &TopView) -> String {
    let mut vips = Table::new(TOP_VIP_COLUMNS);
    for v in &view.vips {
        let panic = if v.panic { "PANIC" } else { "-" };
        vips.row(vec![v.vip.clone(), rate(v.packets_per_s), rate(v.new_flows_per_s), rate(v.dropped_per_s), panic.to_owned()]);
    }
    let mut out = vips.render();
    for v in view.vips.iter().filter(|v| !v.backends.is_empty()) {
        out.push_str(&format!("\n{}\n", v.vip));
        let mut t = Table::new(TOP_BACKEND_COLUMNS);
        for b in &v.backends {
            t.row(vec![
                format!("  {}", b.address),
                format!("{:.1}%", b.share * 100.0),
                rate(b.new_flows_per_s),
                rate(b.packets_per_s),
                b.state.label().to_owned(),
                b.health.clone().unwrap_or_else(|| "-".to_owned()),
                b.weight.to_string(),
                b.effective_weight.to_string(),
            ]);
        }
        out.push_str(&t.render());
    }
    let drops: Vec<&ReasonRate> = view.drops_per_s.iter().filter(|r| r.per_s > 0.0).collect();
    out.push_str("\ndrops/s: ");
    if drops.is_empty() {
        out.push_str("none\n");
    } else {
        out.push_str(&drops.iter().map(|r| format!("{} {}", r.reason, rate(r.per_s))).collect::<Vec<_>>().join("  "));
        out.push('\n');
    }
    out
}

fn rate(per_s: f64) -> String {
    if per_s >= 100.0 { format!("{per_s:.0}") } else { format!("{per_s:.1}") }
}

fn sample(api: &Path) -> Result<Sample, CliError> {
    match client::call(api, &Request::Sample)? {
        Reply::Sample(sample) => Ok(*sample),
        _ => Err(CliError::UnexpectedReply),
    }
}

/// Clears a terminal and puts the cursor home, so each view replaces the last.
const REDRAW: &str = "\x1b[H\x1b[2J";

/// Samples every interval and writes the views: redrawn in place when `tty`, else one
/// after the other, separated by a blank line.
pub fn run(api: &Path, args: &TopArgs, tty: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let interval = Duration::from_secs_f64(args.interval);
    let count = if args.once { Some(1) } else { args.count };
    let mut before = sample(api)?;
    let mut shown = 0;
    // Redrawing in place on a terminal: `q` quits, as in top(1).
    let keys = if tty { Keys::raw() } else { None };
    while count.is_none_or(|n| shown < n) {
        match &keys {
            Some(keys) if keys.quit_within(interval) => break,
            Some(_) => {}
            None => std::thread::sleep(interval),
        }
        let after = sample(api)?;
        let view = rates(&before, &after);
        let text = match args.output.output {
            Format::Json => format!("{}\n", serde_json::to_string(&view).map_err(std::io::Error::from)?),
            Format::Table if tty => format!("{REDRAW}lbctl top (every {} s)\n\n{}", args.interval, render(&view)),
            Format::Table if shown > 0 => format!("\n{}", render(&view)),
            Format::Table => render(&view),
        };
        out.write_all(text.as_bytes())?;
        out.flush()?;
        before = after;
        shown += 1;
    }
    Ok(())
}

/// The terminal on standard input, set to pass keys through one at a time (no line editing,
/// no echo) while `lbctl top` runs, and restored when dropped.
struct Keys {
    saved: libc::termios,
}

impl Keys {
    /// `None` when standard input is not a terminal.
    fn raw() -> Option<Keys> {
        // SAFETY: termios is plain data; tcgetattr fills it or fails (then it is unused).
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &raw mut saved) } != 0 {
            return None;
        }
        // Ctrl-C must end the loop, not the process, or the terminal stays without echo.
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
            libc::signal(libc::SIGTERM, on_interrupt as *const () as libc::sighandler_t);
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: a valid termios for the terminal just read.
        (unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw const raw) } == 0).then_some(Keys { saved })
    }

    /// Waits up to `timeout`; true as soon as `q` is typed.
    fn quit_within(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut poll = libc::pollfd { fd: libc::STDIN_FILENO, events: libc::POLLIN, revents: 0 };
            let millis = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&raw mut poll, 1, millis) };
            if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
                return true;
            }
            if ready < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if ready <= 0 {
                return false;
            }
            let mut typed = [0u8; 16];
            // SAFETY: the buffer outlives the call and its length is passed.
            let n = unsafe { libc::read(libc::STDIN_FILENO, typed.as_mut_ptr().cast(), typed.len()) };
            if n <= 0 {
                return false;
            }
            if wants_quit(&typed[..n as usize]) {
                return true;
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        // SAFETY: restores the settings read at the start.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw const self.saved) };
    }
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether typed bytes ask `lbctl top` to quit: `q` or `Q`.
fn wants_quit(typed: &[u8]) -> bool {
    typed.iter().any(|b| b.eq_ignore_ascii_case(&b'q'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_quits() {
        assert!(wants_quit(b"q") && wants_quit(b"xQ"));
        assert!(!wants_quit(b"") && !wants_quit(b" \n"));
    }
    use spillway_api::{
        ReasonCount,
        sample::{BackendSample, BuildInfo, DaemonSample, FlowTableSample, VipSample},
    };

    fn sample(at_ms: u64, flows: [u64; 2], drops: u64) -> Sample {
        let backend = |addr: &str, new_flows| BackendSample {
            address: addr.parse().unwrap(),
            weight: 100,
            effective_weight: 100,
            packets: new_flows * 10,
            bytes: 0,
            new_flows,
            health: Some("healthy".into()),
            latency_ms: None,
            pressure: None,
        };
        Sample {
            at_ms,
            info: BuildInfo::default(),
            vips: vec![VipSample {
                vip: "10.0.0.1:80/tcp".parse().unwrap(),
                packets: (flows[0] + flows[1]) * 10 + drops,
                bytes: 0,
                new_flows: flows[0] + flows[1],
                flow_entries: None,
                health: None,
                budget: None,
                spill_per_s: 0,
                backends: vec![backend("10.0.1.1", flows[0]), backend("10.0.1.2", flows[1])],
            }],
            reasons: vec![
                ReasonCount { reason: "tx".into(), packets: 1 },
                ReasonCount { reason: "drop_vip_budget".into(), packets: drops },
            ],
            observed: Vec::new(),
            rules: Vec::new(),
            flow_table: FlowTableSample { capacity: 1, entries: None, counted_s_ago: None, unremembered: 0 },
            maps: Vec::new(),
            daemon: DaemonSample::default(),
            second_chance_packets: 0,
            pass_to_missing: 0,
            quic: Vec::new(),
            announcements: None,
            interfaces: Vec::new(),
        }
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let view = rates(&sample(1_000, [100, 300], 5), &sample(3_000, [200, 500], 45));
        assert_eq!(view.interval_s, 2.0);
        let v = &view.vips[0];
        assert_eq!((v.new_flows_per_s, v.packets_per_s, v.dropped_per_s), (150.0, 1520.0, 20.0));
        assert_eq!((v.backends[0].share, v.backends[1].share), (50.0 / 150.0, 100.0 / 150.0));
        assert_eq!(view.drops_per_s, [ReasonRate { reason: "drop_vip_budget".into(), per_s: 20.0 }]);
        let text = render(&view);
        assert!(text.contains("33.3%") && text.contains("66.7%") && text.contains("drop_vip_budget 20.0"), "{text}");
        // A drained backend: its operator's weight is 0, and its state says why.
        let mut drained = sample(3_000, [200, 500], 45);
        drained.vips[0].backends[1].weight = 0;
        let view = rates(&sample(1_000, [100, 300], 5), &drained);
        assert_eq!((view.vips[0].backends[0].state, view.vips[0].backends[1].state), (BackendState::Active, BackendState::Draining));
        let row = render(&view).lines().find(|l| l.contains("10.0.1.2")).unwrap().to_owned();
        assert!(row.contains(" draining  healthy ") && row.ends_with("  0        100"), "{row}");
        // A counter that restarted (a reused id) does not go negative.
        let back = rates(&sample(3_000, [200, 500], 45), &sample(4_000, [10, 500], 45));
        assert_eq!(back.vips[0].backends[0].new_flows_per_s, 0.0);
    }
}
