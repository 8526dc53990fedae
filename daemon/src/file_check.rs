//! `lbd check -f FILE`: the checks a start makes of a configuration file, without starting:
//! its syntax and fields, the `[lbd]` and `[agent]` settings (each by its option's parser,
//! then all together as a start parses them), the desired state, and what this host allows
//! (the interface exists and forwards, no VIP on the host's own addresses, an outer source
//! for every backend's family). Every VIP and backend is checked as on a first start.
//!
//! A file with nothing but `[agent]` is a backend's (`lbd agent --config`): it is checked as
//! an agent's start checks it, on this host. A file with both is checked as both, the
//! agent's interface excepted: that names a backend's NIC, not this host's.

use std::{ffi::OsString, fmt, path::Path};

use clap::Parser;

use super::{
    DaemonError,
    args::{AllowFromError, LbdArgs, LbdCommand},
    core::host_refusal,
    resolve::environment_has,
    settings::{Section, Settings, clap_message},
};
use spillway_dataplane::forwarding;
use spillway_dataplane::netif;
use spillway_model::config::{ConfigError, Document};

/// A file that passed: what it declares.
#[derive(Debug, PartialEq, Eq)]
pub struct Checked {
    /// The balancer's part: `None` for an agent's file.
    pub balancer: Option<Declared>,
    /// The `[agent]` table's interface, when the file has one.
    pub agent_iface: Option<String>,
}

/// What a balancer's file declares.
#[derive(Debug, PartialEq, Eq)]
pub struct Declared {
    pub vips: usize,
    pub backends: usize,
    pub rules: usize,
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let balancer = self.balancer.as_ref().map(|d| format!("{} VIPs, {} backends, {} rules", d.vips, d.backends, d.rules));
        let agent = self.agent_iface.as_ref().map(|iface| format!("lbd agent on {iface}"));
        let parts: Vec<String> = balancer.into_iter().chain(agent).collect();
        f.write_str(&parts.join("; "))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{file}: {section}: {message}")]
    Settings { file: String, section: &'static str, message: String },
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error("{file}: agent: {error}")]
    Agent { file: String, error: AllowFromError },
}

pub fn check(path: &Path) -> Result<Checked, CheckError> {
    let doc = Document::read(path)?;
    let agent_only = doc.is_agent_only();
    let balancer = (!agent_only).then(|| check_balancer(path, &doc)).transpose()?;
    let agent_iface = doc.agent().map(|_| check_agent(path, &doc, agent_only)).transpose()?;
    Ok(Checked { balancer, agent_iface })
}

/// The file's settings of `section` as a start parses them: after the command words, with
/// the others, so that conflicts and a missing required option show.
fn parse_settings(path: &Path, doc: &Document, section: Section) -> Result<LbdArgs, CheckError> {
    let settings = Settings::from_file(doc, section)?.without_environment(section, environment_has);
    let command_words: &[&str] = match section {
        Section::Lbd => &["lbd"],
        Section::Agent => &["lbd", "agent"],
    };
    let argv: Vec<OsString> = command_words
        .iter()
        .map(OsString::from)
        .chain(["--config".into(), path.as_os_str().to_owned()])
        .chain(settings.to_args(section).into_iter().map(OsString::from))
        .collect();
    LbdArgs::try_parse_from(argv).map_err(|e| settings_error(doc, section, clap_message(&e)))
}

fn settings_error(doc: &Document, section: Section, message: String) -> CheckError {
    CheckError::Settings { file: doc.name().to_owned(), section: section.name(), message }
}

fn check_balancer(path: &Path, doc: &Document) -> Result<Declared, CheckError> {
    let args = parse_settings(path, doc, Section::Lbd)?.daemon;
    super::beside::check_args(&args).map_err(DaemonError::from)?;
    let state = doc.desired_state()?;
    let no_iface = || settings_error(doc, Section::Lbd, "no iface: set iface in [lbd], as lbd --config needs".to_owned());
    if args.iface.is_empty() {
        return Err(no_iface());
    }
    let first = super::check_uplinks(&args.iface)?;
    for iface in super::present(&args.iface) {
        let off = forwarding::disabled(iface).map_err(DaemonError::from)?;
        if !off.is_empty() && !args.enable_forwarding {
            return Err(DaemonError::ForwardingDisabled { iface: iface.to_owned(), sysctls: forwarding::describe(&off) }.into());
        }
    }
    let host = super::host_facts(&args, first)?;
    host.check(&Default::default(), &state).map_err(|e| host_refusal(doc, e))?;
    Ok(Declared { vips: state.vips.len(), backends: state.vips.values().map(|v| v.backends.len()).sum(), rules: state.rules.len() })
}

/// The `[agent]` table as `lbd agent --config` starts from it; on this host (`on_this_host`)
/// its interface must exist too. Returns the interface.
fn check_agent(path: &Path, doc: &Document, on_this_host: bool) -> Result<String, CheckError> {
    let Some(LbdCommand::Agent(args)) = parse_settings(path, doc, Section::Agent)?.command else {
        unreachable!("`lbd agent ...` parses as the agent")
    };
    let no_iface = || settings_error(doc, Section::Agent, "no iface: set iface in [agent], as lbd agent --config needs".to_owned());
    let iface = args.iface.clone().ok_or_else(no_iface)?;
    args.check_allow_from().map_err(|error| CheckError::Agent { file: doc.name().to_owned(), error })?;
    if on_this_host {
        netif::ifindex(&iface).map_err(DaemonError::from)?;
    }
    Ok(iface)
}
