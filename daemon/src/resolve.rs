//! What `lbd` runs with: its command line, with the `--config` file's section (and the
//! environment's `LBD_*` variables) merged in as options, the command line winning.

use std::ffi::OsString;

use clap::{ArgMatches, CommandFactory, FromArgMatches};

use super::{
    args::{LbdArgs, LbdCommand},
    settings::{RunningSettings, Section, Settings},
};
use spillway_model::config::{ConfigError, Document};

/// What `lbd` runs with: its arguments with those of the `--config` file's section.
#[derive(Debug)]
pub struct Resolved {
    pub args: LbdArgs,
    pub config: Option<Document>,
    pub settings: RunningSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// Also `--help` and `--version`: `exit()` prints them.
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Parses `argv`; with `--config`, reads the file and parses again with its section's
/// settings placed before the command line's own arguments (so those win).
pub fn resolve(argv: Vec<OsString>) -> Result<Resolved, ArgsError> {
    let matches = LbdArgs::command().try_get_matches_from(&argv)?;
    let args = LbdArgs::from_arg_matches(&matches)?;
    let (section, config) = match &args.command {
        None => (Section::Lbd, args.daemon.config.clone()),
        Some(LbdCommand::Agent(agent)) => (Section::Agent, agent.config.clone()),
        Some(_) => return Ok(Resolved { args, config: None, settings: RunningSettings::default() }),
    };
    let section_matches = |m: &ArgMatches| m.subcommand_matches("agent").unwrap_or(m).clone();
    let command_line = Settings::from_matches(section, &section_matches(&matches));
    let Some(path) = config else {
        return Ok(Resolved { args, config: None, settings: RunningSettings { effective: command_line.clone(), command_line } });
    };
    let doc = Document::read(&path)?;
    let mut from_file = Settings::from_file(&doc, section)?.without_environment(section, environment_has);
    if section == Section::Lbd && args.daemon.cleanup {
        // Cleanup takes where lbd pinned and announced from the file; the interface it ran
        // on is not needed (and as an option, would conflict with --cleanup).
        from_file.remove("iface");
    }
    let split = section.argv_prefix().min(argv.len());
    let merged: Vec<OsString> = argv[..split]
        .iter()
        .cloned()
        .chain(from_file.to_args(section).into_iter().map(OsString::from))
        .chain(argv[split..].iter().cloned())
        .collect();
    let matches = LbdArgs::command().try_get_matches_from(merged)?;
    let args = LbdArgs::from_arg_matches(&matches)?;
    let effective = Settings::from_matches(section, &section_matches(&matches));
    Ok(Resolved { args, config: Some(doc), settings: RunningSettings { effective, command_line } })
}

/// Whether `name` is set in the environment (clap then takes its value, empty or not).
pub fn environment_has(name: &std::ffi::OsStr) -> bool {
    std::env::var_os(name).is_some()
}
