//! `lbd check -f FILE`: the checks a start makes of a configuration file, without starting:
//! its syntax and fields, the `[lbd]` and `[agent]` settings (each by its option's parser,
//! then all together as a start parses them), the desired state, and what this host allows
//! (the interface exists and forwards, no VIP on the host's own addresses, an outer source
//! for every backend's family). Every VIP and backend is checked as on a first start.

use std::{ffi::OsString, path::Path};

use clap::Parser;

use super::{
    DaemonError,
    args::LbdArgs,
    core::host_refusal,
    settings::{Section, Settings, clap_message},
};
use crate::{
    config::{ConfigError, Document},
    forwarding, netif,
};

/// A file that passed: what it declares.
#[derive(Debug, PartialEq, Eq)]
pub struct Checked {
    pub vips: usize,
    pub backends: usize,
    pub rules: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{file}: lbd: {message}")]
    Settings { file: String, message: String },
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

pub fn check(path: &Path) -> Result<Checked, CheckError> {
    let doc = Document::read(path)?;
    let settings = Settings::from_file(&doc, Section::Lbd)?;
    Settings::from_file(&doc, Section::Agent)?;
    // As a start parses them: with the others, so conflicts and a missing iface show.
    let argv: Vec<OsString> = ["lbd".into(), "--config".into(), path.as_os_str().to_owned()]
        .into_iter()
        .chain(settings.to_args(Section::Lbd).into_iter().map(OsString::from))
        .collect();
    let settings_error = |message: String| CheckError::Settings { file: doc.name().to_owned(), message };
    let args = LbdArgs::try_parse_from(argv).map_err(|e| settings_error(clap_message(&e)))?.daemon;
    let state = doc.desired_state()?;
    let iface = args.iface.as_deref().ok_or_else(|| settings_error("no iface: set iface in [lbd], as lbd --config needs".to_owned()))?;
    netif::ifindex(iface).map_err(DaemonError::from)?;
    let off = forwarding::disabled(iface).map_err(DaemonError::from)?;
    if !off.is_empty() && !args.enable_forwarding {
        return Err(DaemonError::ForwardingDisabled { iface: iface.to_owned(), sysctls: forwarding::describe(&off) }.into());
    }
    let host = super::host_facts(&args, iface)?;
    host.check(&Default::default(), &state).map_err(|e| host_refusal(&doc, e))?;
    Ok(Checked { vips: state.vips.len(), backends: state.vips.values().map(|v| v.backends.len()).sum(), rules: state.rules.len() })
}
