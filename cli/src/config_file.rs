//! `lbctl apply`, `diff`, `export` and `status`: reading a configuration file to send, and
//! rendering what lbd answers.

use std::{
    fs::File,
    io::{self, Read},
    path::PathBuf,
};

use clap::Args;

use super::{
    CliError,
    table::{Align, Table, printable},
};
use spillway_api::{AnnouncementsStatus, Applied, Started, Status};
use spillway_model::config::{self, MAX_CONFIG_BYTES};

pub const APPLY_HELP: &str = "\
Examples:
  lbctl diff -f /etc/spillway/spillway.toml      # first, what would change
  lbctl apply -f /etc/spillway/spillway.toml
  lbctl export | lbctl apply -f -                 # changes nothing

The file is the whole desired state: VIPs and their backends, limits and rules (see the
example spillway.toml: deploy/spillway.toml in the source tree, installed in
<prefix>/share/doc/spillway/, and as /etc/spillway/spillway.toml when there was none).
It is applied as one change: all of it, or on any error none of it. A bad file is refused
whole with its line, column and field. Removing a VIP that still has backends is refused
unless --allow-vip-removal; removing a backend that still serves (not drained first)
unless --allow-backend-removal. Settings of [lbd] take effect when lbd starts: those that
differ from the running ones are reported. lbctl edits made later are kept until a file
is applied again: when lbd's own --config file declares what this file declared, lbd
takes it as applied, and restarts and reloads keep the edits until that file changes.

A serving backend without started_at in the file gets one, and lbctl writes it into
the file (a line after its address; nothing else changes): the time lbd applied it for a
backend that starts serving with the file (new to this lbd, or no longer drained), the
start it already had for one that serves already. Its slow start runs from that time on
the wall clock, so every balancer given the file ramps it alike, and the file, once
applied, has its starts: it does not change again on the next balancer.

Output: one line per VIP, backend, rule or default limits added (+), removed (-) or
changed (~). JSON output (-o json):
  {\"applied\":true,\"changes\":[{\"change\":\"changed\",\"item\":\"backend\",
    \"vip\":\"10.0.0.1:80/tcp\",\"backend\":\"10.0.1.1\",
    \"fields\":[{\"field\":\"weight\",\"from\":100,\"to\":200}]}],
   \"notes\":[],\"slots_written\":2017,\"tables_flipped\":1}
  item is default_limits, vip, backend or rule (with \"rule\":\"CIDR[@VIP]\"); a field
  without from (to) was not set before (after). \"started\" (when any) lists the starts
  filled in: [{\"vip\":...,\"backend\":...,\"started_at_unix_ms\":N}].";

pub const DIFF_HELP: &str = "\
Examples:
  lbctl diff -f /etc/spillway/spillway.toml
  lbctl diff -f spillway.toml -o json

Checks the file as lbctl apply would and prints what applying it would change; changes
nothing. A change apply would refuse as it is (removing a VIP that still has backends,
without --allow-vip-removal, or a backend that still serves, without
--allow-backend-removal) is shown marked (refused: why). Settings of [lbd] that
differ from the running ones are differences too: they take effect at the next start
of lbd. To check a file without a running lbd: lbd check -f FILE.

Exit status:
  0  no differences
  1  differences, all of which apply would make
  2  the file (or the request) is refused: invalid, or lbd unreachable
  3  differences, some of which apply would refuse (marked refused)
Output: as lbctl apply (see lbctl apply --help); in JSON a refused change has
\"refused\":\"why\".";

pub const EXPORT_HELP: &str = "\
Examples:
  lbctl export > spillway.toml
  lbctl export | lbctl diff -f -                  # no changes

Prints the running desired state (lbctl edits included) as a configuration file, with
the [lbd] settings lbd was given (on its command line or in its --config file).";

pub const STATUS_HELP: &str = "\
Example:
  lbctl status -o json

Map columns: MAP (the pinned map), USED (entries in use; - for maps of
counters), MAX (its capacity), USE (USED / MAX) and MEMORY (the kernel's
accounting of its memory).

JSON output (-o json):
  {\"version\":\"0.1.0\",\"uptime_s\":3600,
   \"interfaces\":[{\"name\":\"eth0\",\"xdp_mode\":\"native\",\"attachment\":\"took_over\",\"state\":\"up\"},
                 {\"name\":\"eth1\",\"xdp_mode\":\"native\",\"attachment\":\"-\",\"state\":\"gone\"}],
   \"pin_dir\":\"/sys/fs/bpf/spillway\",
   \"state_dir\":\"/var/lib/spillway\",\"health_checks\":true,\"zone\":\"a\",
   \"config\":{\"file\":\"/etc/spillway/spillway.toml\",\"last\":\"applied on SIGHUP\"},
   \"vips\":2,\"backends\":6,\"rules\":1,
   \"maps\":[{\"name\":\"spw_flows\",\"max_entries\":1048576,\"used\":1200}, ...],
   \"watcher\":{\"state\":\"loaded\",\"mode\":\"btf\",\"summary\":\"mode btf, 6 of 6 parts watched\"},
   \"announcements\":{\"state\":\"announcing\",\"addresses\":{\"announced\":2}},
   \"alerts\":[]}
  Each interface: attachment is attached, took_over (a running link's program was
  replaced), reattached, unattached (lbd --xdp-attach none: your root program calls
  the balancer) or - (not driven now); state is up, down (not up, or no
  carrier), gone (no such interface: attached again when it is back) or not_attached
  (error says why); forwarding_off names the forwarding sysctls found at 0.
  entry_program (unattached) is where the entry program is pinned for your root
  program; pass_to is lbd --pass-to, when set. config is absent without --config; its error says why it was last
  refused. used is absent for maps of counters (the connection table's count is at
  most 15 s old); bytes is the kernel's memory accounting of the map. watcher.state
  is loaded (with its mode: btf, tracepoint or sock_diag) or not_loaded (with error).
  announcements.state is off (no BIRD configured), announcing (every VIP address
  with backends announced normally), degraded (some degraded or withdrawn for a
  fault, or BIRD did not take the last change) or withdrawn (none announced); reason
  says why (program_detached, interface_down, forwarding_disabled, BIRD: ...,
  no_backends); addresses counts VIP addresses per state (lbctl vips list has each).
  alerts lists every ALERT of lbd (also shown by vips list, backends list, stats).";

#[derive(Debug, Args)]
pub struct FileArg {
    /// The configuration file (- for standard input).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
}

impl FileArg {
    /// The file's text (at most `MAX_CONFIG_BYTES`; lbd checks it again) and its name.
    pub fn read(&self) -> Result<(String, String), CliError> {
        let stdin = self.file.as_os_str() == "-";
        let name = if stdin { "<stdin>".to_owned() } else { self.file.display().to_string() };
        let bad = |problem: String| CliError::BadOption(format!("{name}: {problem}"));
        let reader: Box<dyn Read> =
            if stdin { Box::new(io::stdin()) } else { Box::new(File::open(&self.file).map_err(|e| bad(format!("reading it: {e}")))?) };
        let mut text = String::new();
        reader.take(MAX_CONFIG_BYTES as u64 + 1).read_to_string(&mut text).map_err(|e| bad(format!("reading it: {e}")))?;
        if text.len() > MAX_CONFIG_BYTES {
            return Err(bad(format!("larger than the {} MiB a configuration may be", MAX_CONFIG_BYTES >> 20)));
        }
        Ok((text, name))
    }
}

/// Writes the starts `lbd` gave (`applied.started`) into the file that was applied, so that
/// the other balancers given it ramp those backends alike; says what it did, or which lines
/// to add by hand when it could not (standard input, a read-only file, a layout it cannot
/// place a line in).
pub fn write_starts(file: &FileArg, started: &[Started]) -> Option<String> {
    if started.is_empty() {
        return None;
    }
    let starts: Vec<_> = started.iter().map(|s| (s.vip, s.backend, s.started_at_unix_ms)).collect();
    let written = if file.file.as_os_str() == "-" {
        Err("the file is standard input".to_owned())
    } else {
        file.read().map_err(|e| e.to_string()).and_then(|(text, name)| {
            let out = config::with_starts(&name, &text, &starts)?;
            replace_file(&file.file, &out).map_err(|e| format!("writing {name}: {e}"))
        })
    };
    Some(match written {
        Ok(()) => format!(
            "wrote started_at of {} backends into {}: give the other balancers this file, so that they ramp them alike\n",
            started.len(),
            file.file.display()
        ),
        Err(why) => {
            let mut out = format!("started_at not written into the file ({why}); add it so that the other balancers ramp alike:\n");
            for (vip, backend, at) in &starts {
                out.push_str(&format!("  {vip} backend {backend}: started_at = {}\n", config::format_unix_ms(*at)));
            }
            out
        }
    })
}

/// Replaces `path`'s contents with `text` at once (a temporary file beside it, renamed over
/// it, with its permissions); a symbolic link's target is replaced, not the link.
fn replace_file(path: &std::path::Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    let path = std::fs::canonicalize(path)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.lbctl-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&temp)?;
        f.set_permissions(std::fs::metadata(&path)?.permissions())?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&temp, &path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The changes, one per line, the settings that differ (`~ lbd.KEY: ...`), then what was
/// done.
pub fn applied_text(applied: &Applied) -> String {
    let mut out: String = applied.changes.iter().map(|c| format!("{c}\n")).collect();
    for note in &applied.notes {
        out.push_str(&format!("~ {note}\n"));
    }
    let refused = applied.changes.iter().filter(|c| c.refused.is_some()).count();
    let mut summary = match (applied.applied, applied.changes.len()) {
        (_, 0) if applied.notes.is_empty() => "no changes".to_owned(),
        (_, 0) => "no changes to the desired state".to_owned(),
        (false, n) if refused > 0 => {
            format!("{n} changes, {refused} of which apply would refuse (marked refused; nothing was changed)")
        }
        (false, n) => format!("{n} changes would be applied (nothing was changed)"),
        (true, n) => format!("applied {n} changes (slots_written={} tables_flipped={})", applied.slots_written, applied.tables_flipped),
    };
    if !applied.notes.is_empty() {
        summary.push_str(&format!("; {} settings of [lbd] differ: they take effect at the next start of lbd", applied.notes.len()));
    }
    out + &summary + "\n"
}

/// `lbctl status`: the pinned maps.
pub(super) const MAP_COLUMNS: &[(&str, Align)] =
    &[("MAP", Align::Left), ("USED", Align::Right), ("MAX", Align::Right), ("USE", Align::Right), ("MEMORY", Align::Right)];

/// `degraded (program_detached): 1 announced, 1 degraded`.
fn announcements_text(a: &AnnouncementsStatus) -> String {
    let mut text = a.state.clone();
    if let Some(reason) = &a.reason {
        text.push_str(&format!(" ({})", printable(reason)));
    }
    if !a.addresses.is_empty() {
        let counts: Vec<String> = a.addresses.iter().map(|(state, n)| format!("{n} {state}")).collect();
        text.push_str(&format!(": {}", counts.join(", ")));
    }
    text
}

pub fn status_text(status: &Status) -> String {
    let uptime = {
        let s = status.uptime_s;
        match s {
            0..60 => format!("{s}s"),
            60..3600 => format!("{}m {}s", s / 60, s % 60),
            3600..86_400 => format!("{}h {}m", s / 3600, s / 60 % 60),
            _ => format!("{}d {}h", s / 86_400, s / 3600 % 24),
        }
    };
    let mut out = format!("lbd {}, up {uptime}\n", status.version);
    let mut line = |label: &str, value: String| out.push_str(&format!("{label:<14}{value}\n"));
    for (n, i) in status.interfaces.iter().enumerate() {
        let mut text = format!("{}: {} ({} XDP, {})", i.name, i.state.replace('_', " "), i.xdp_mode, i.attachment.replace('_', " "));
        if let Some(off) = &i.forwarding_off {
            text.push_str(&format!(", forwarding off: {off}"));
        }
        if let Some(error) = &i.error {
            text.push_str(&format!(": {error}"));
        }
        line(if n == 0 { "interfaces" } else { "" }, text);
    }
    if let Some(entry) = &status.entry_program {
        line("entry program", format!("{entry} (for your root program's program array)"));
    }
    if let Some(pass_to) = &status.pass_to {
        line("pass to", format!("{pass_to} (frames the balancer does not serve)"));
    }
    line("pins", status.pin_dir.clone());
    line("state", format!("{}: {} VIPs, {} backends, {} rules", status.state_dir, status.vips, status.backends, status.rules));
    let health = if status.health_checks { "on" } else { "off (--no-health-checks)" };
    line("health checks", format!("{health}, zone {}", status.zone.as_deref().unwrap_or("-")));
    if let Some(config) = &status.config {
        line("config", format!("{}: {}", config.file, config.last));
        if let Some(error) = &config.error {
            line("", format!("error: {error}"));
        }
    }
    let w = &status.watcher;
    let watcher = match (&w.error, &w.summary) {
        (Some(error), _) => format!("{}: {error}", w.state),
        (None, Some(summary)) => summary.clone(),
        (None, None) => w.state.clone(),
    };
    line("port watcher", watcher);
    line("announcements", announcements_text(&status.announcements));
    let mut maps = Table::new(MAP_COLUMNS);
    for m in &status.maps {
        let share = m.used.filter(|_| m.max_entries > 0).map(|u| format!("{:.0}%", u as f64 * 100.0 / f64::from(m.max_entries)));
        let memory = m.bytes.map(|b| format!("{:.1} MiB", b as f64 / f64::from(1 << 20)));
        let dash = |cell: Option<String>| cell.unwrap_or_else(|| "-".to_owned());
        maps.row(vec![m.name.clone(), dash(m.used.map(|u| u.to_string())), m.max_entries.to_string(), dash(share), dash(memory)]);
    }
    out.push('\n');
    out.push_str(&maps.render());
    for alert in &status.alerts {
        out.push_str(&format!("\n{alert}\n"));
    }
    out
}
