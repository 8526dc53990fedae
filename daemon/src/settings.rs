//! `lbd`'s settings as a configuration file holds them: each key of `[lbd]` (or `[agent]`)
//! is a long command-line option (`tcp_idle_timeout_s` for `--tcp-idle-timeout-s`) and its
//! value what the option takes. A file's settings become arguments placed before the real
//! ones, so clap checks both alike and the command line wins; a new option is a new setting.

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, parser::ValueSource};

use super::args::LbdArgs;
use spillway_model::config::{ConfigError, Document, FieldPath};

/// The one setting `lbd` changes while running (`Core::take_uplinks`); the others wait for a
/// restart.
pub const LIVE_IFACE: &str = "iface";

/// Options that say what to do, not how to run: never settings.
const NOT_SETTINGS: [&str; 4] = ["help", "version", "config", "cleanup"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// `[lbd]`: the balancer daemon.
    Lbd,
    /// `[agent]`: `lbd agent`.
    Agent,
}

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::Lbd => "lbd",
            Section::Agent => "agent",
        }
    }

    /// The clap command whose options the section's keys are.
    fn command(self) -> Command {
        let mut root = LbdArgs::command();
        root.build();
        match self {
            Section::Lbd => root,
            Section::Agent => root.find_subcommand("agent").cloned().unwrap_or(root),
        }
    }

    /// How many leading command-line words select the section (`lbd`, `lbd agent`): a file's
    /// settings go after them.
    pub fn argv_prefix(self) -> usize {
        match self {
            Section::Lbd => 1,
            Section::Agent => 2,
        }
    }

    fn table(self, doc: &Document) -> Option<&toml::Table> {
        match self {
            Section::Lbd => doc.lbd(),
            Section::Agent => doc.agent(),
        }
    }
}

/// Settings by key, each with its option's values as typed (`["true"]` for a set flag; an
/// unset flag is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings(BTreeMap<String, Vec<String>>);

fn key_of(arg: &Arg) -> Option<String> {
    let long = arg.get_long()?;
    (!NOT_SETTINGS.contains(&long)).then(|| long.replace('-', "_"))
}

fn find<'a>(command: &'a Command, key: &str) -> Option<&'a Arg> {
    command.get_arguments().find(|arg| key_of(arg).as_deref() == Some(key))
}

/// The first line of a clap error, without its `error: `.
pub(super) fn clap_message(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

impl Settings {
    /// The section's settings in `doc`, each checked by its option's own parser.
    pub fn from_file(doc: &Document, section: Section) -> Result<Self, ConfigError> {
        let command = section.command();
        let mut settings = Settings::default();
        for (key, value) in section.table(doc).into_iter().flatten() {
            let refuse = |message: String| doc.refuse(&FieldPath::default().key(section.name()).key(key), message);
            let Some(arg) = find(&command, key) else {
                let known: Vec<String> = command.get_arguments().filter_map(key_of).collect();
                return Err(refuse(format!("unknown setting of {}; the settings are {}", section.name(), known.join(", "))));
            };
            let scalar = |value: &toml::Value| match value {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                _ => Err(refuse(format!("expected a string or a number, found {}", value.type_str()))),
            };
            let values = match (arg.get_action(), value) {
                (ArgAction::SetTrue, toml::Value::Boolean(set)) => {
                    if *set {
                        vec!["true".to_owned()]
                    } else {
                        Vec::new()
                    }
                }
                (ArgAction::SetTrue, other) => return Err(refuse(format!("expected true or false, found {}", other.type_str()))),
                (ArgAction::Append, toml::Value::Array(items)) => items.iter().map(scalar).collect::<Result<_, _>>()?,
                (_, value) => vec![scalar(value)?],
            };
            let one = Settings(BTreeMap::from([(key.clone(), values)]));
            // Checked alone, so that a refusal is this key's. `--config` stands in for the
            // file, which makes the required options optional.
            let mut argv = vec!["lbd".to_owned()];
            argv.extend((section == Section::Agent).then(|| "agent".to_owned()));
            argv.extend(["--config".to_owned(), "-".to_owned()]);
            argv.extend(one.to_args(section));
            LbdArgs::command().try_get_matches_from(argv).map_err(|e| refuse(clap_message(&e)))?;
            settings.0.extend(one.0.into_iter().filter(|(_, values)| !values.is_empty()));
        }
        Ok(settings)
    }

    /// The settings `matches` (the section's) give explicitly: on the command line, in a
    /// file that became arguments, or in the option's environment variable.
    pub fn from_matches(section: Section, matches: &ArgMatches) -> Self {
        let command = section.command();
        let explicit = command.get_arguments().filter_map(|arg| {
            let key = key_of(arg)?;
            let id = arg.get_id().as_str();
            if !matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
                return None;
            }
            let values = match arg.get_action() {
                ArgAction::SetTrue => vec!["true".to_owned()],
                _ => matches.get_raw(id)?.map(|v| v.to_string_lossy().into_owned()).collect(),
            };
            Some((key, values))
        });
        Settings(explicit.collect())
    }

    /// Without the settings whose option's environment variable is set (`is_set` says which):
    /// those win over a file's, as the command line does, so that one file serves every
    /// balancer and each host sets its own (`LBD_OUTER_SRC` in a systemd drop-in).
    pub fn without_environment(mut self, section: Section, is_set: impl Fn(&std::ffi::OsStr) -> bool) -> Self {
        let command = section.command();
        self.0.retain(|key, _| !find(&command, key).and_then(Arg::get_env).is_some_and(&is_set));
        self
    }

    pub fn get(&self, key: &str) -> Option<&[String]> {
        self.0.get(key).map(Vec::as_slice)
    }

    pub fn remove(&mut self, key: &str) {
        self.0.remove(key);
    }

    pub fn set(&mut self, key: &str, values: Vec<String>) {
        self.0.insert(key.to_owned(), values);
    }

    /// As command-line arguments.
    pub fn to_args(&self, section: Section) -> Vec<String> {
        let command = section.command();
        let mut args = Vec::new();
        for (key, values) in &self.0 {
            let Some(long) = find(&command, key).and_then(Arg::get_long) else { continue };
            let flag = format!("--{long}");
            match find(&command, key).map(Arg::get_action) {
                Some(ArgAction::SetTrue) => args.push(flag),
                // Joined, so a value that starts with `-` (`echo_total = -1`) is read as the
                // value it is, and refused as such, not taken for another option.
                _ => values.iter().for_each(|v| args.push(format!("{flag}={v}"))),
            }
        }
        args
    }

    /// As the section's table of a configuration file (what `lbctl export` writes).
    pub fn to_table(&self, section: Section) -> toml::Table {
        let command = section.command();
        let value = |v: &String| v.parse::<i64>().map_or_else(|_| toml::Value::String(v.clone()), toml::Value::Integer);
        self.0
            .iter()
            .map(|(key, values)| {
                let value = match find(&command, key).map(Arg::get_action) {
                    Some(ArgAction::SetTrue) => toml::Value::Boolean(true),
                    // One value as itself (`iface = "eth0"`), as a file would say it.
                    Some(ArgAction::Append) if values.len() != 1 => toml::Value::Array(values.iter().map(value).collect()),
                    _ => values.first().map_or(toml::Value::String(String::new()), value),
                };
                (key.clone(), value)
            })
            .collect()
    }
}

/// The settings `lbd` runs with, and those its command line gave (which win over a file's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningSettings {
    pub effective: Settings,
    pub command_line: Settings,
}

impl RunningSettings {
    /// The interfaces a file's `[lbd]` names, when they differ from those running and the
    /// command line names none of its own (which would win): `lbd` moves to them while
    /// running.
    pub fn uplinks_from(&self, file: &Settings) -> Option<Vec<String>> {
        if self.command_line.get(LIVE_IFACE).is_some() {
            return None;
        }
        let named = file.get(LIVE_IFACE)?;
        (self.effective.get(LIVE_IFACE) != Some(named)).then(|| named.to_vec())
    }

    /// How a file's `[lbd]` settings differ from the running ones: one note each (settings
    /// take effect when `lbd` starts).
    pub fn notes(&self, file: &Settings) -> Vec<String> {
        let shown = |values: Option<&[String]>| values.map_or("its default".to_owned(), |v| v.join(" "));
        file.0
            .iter()
            .filter_map(|(key, values)| {
                let ours = Some(values.as_slice());
                if key == LIVE_IFACE && self.uplinks_from(file).is_some() {
                    return None;
                }
                if let Some(cli) = self.command_line.get(key).filter(|cli| Some(*cli) != ours) {
                    return Some(format!(
                        "lbd.{key}: the file says {}, but lbd's command line sets {} and wins",
                        shown(ours),
                        cli.join(" ")
                    ));
                }
                let running = self.effective.get(key);
                (running != ours).then(|| {
                    format!("lbd.{key}: the file says {}, lbd runs with {}: takes effect when lbd restarts", shown(ours), shown(running))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsString, fs};

    use super::*;
    use crate::resolve::resolve;
    use crate::testing::TempDir;

    const EXAMPLE: &str = include_str!("../../deploy/spillway.toml");

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn file(tmp: &TempDir, text: &str) -> String {
        let path = tmp.path().join("spillway.toml");
        fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn the_example_documents_every_setting() {
        // Set, or commented out with its default, in its section.
        let setting = |l: &str| {
            l.split_once(" = ").is_some_and(|(k, _)| k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
        };
        let uncommented: Vec<&str> = EXAMPLE.lines().map(|l| l.strip_prefix("# ").filter(|l| setting(l)).unwrap_or(l)).collect();
        let uncommented = uncommented.join("\n");
        let doc = Document::parse("example", uncommented).unwrap();
        for section in [Section::Lbd, Section::Agent] {
            let table = section.table(&doc).unwrap();
            for key in section.command().get_arguments().filter_map(key_of) {
                assert!(table.contains_key(&key), "[{}] {key} is not in deploy/spillway.toml", section.name());
            }
            // Every example value is valid, commented or not.
            Settings::from_file(&doc, section).unwrap();
            Settings::from_file(&Document::parse("example", EXAMPLE.to_owned()).unwrap(), section).unwrap();
        }
    }

    #[test]
    fn file_settings_are_options_and_the_command_line_wins() {
        let tmp = TempDir::new("settings");
        let path = file(
            &tmp,
            "vips = []\n[lbd]\niface = \"eth9\"\nzone = \"a\"\ntcp_idle_timeout_s = 60\nno_health_checks = true\ntx_iface = [\"eth1\", \"eth2\"]\n\
             [agent]\niface = \"eth3\"\nleak_after_s = 7\n",
        );
        let resolved = resolve(argv(&["lbd", "--config", &path, "--zone", "b"])).unwrap();
        let d = &resolved.args.daemon;
        assert_eq!((d.iface.as_slice(), d.zone.as_deref(), d.tcp_idle_timeout_s), (&["eth9".to_owned()][..], Some("b"), 60));
        assert!(d.no_health_checks);
        assert_eq!(d.tx_ifaces, ["eth1", "eth2"]);
        assert!(resolved.config.is_some());
        let settings = &resolved.settings;
        assert_eq!(settings.command_line.get("zone"), Some(&["b".to_owned()][..]));
        assert_eq!(settings.command_line.get("iface"), None);
        assert_eq!(settings.effective.get("iface"), Some(&["eth9".to_owned()][..]));
        assert_eq!(settings.effective.get("no_health_checks"), Some(&["true".to_owned()][..]));
        // The file's settings differ from nothing it runs with, except where the command
        // line overrode them.
        let from_file = Settings::from_file(resolved.config.as_ref().unwrap(), Section::Lbd).unwrap();
        assert_eq!(settings.notes(&from_file), ["lbd.zone: the file says a, but lbd's command line sets b and wins"]);
        let table = settings.effective.to_table(Section::Lbd);
        assert_eq!(table["tcp_idle_timeout_s"], toml::Value::Integer(60));
        assert_eq!(table["no_health_checks"], toml::Value::Boolean(true));
        assert_eq!(table["tx_iface"], toml::Value::Array(vec!["eth1".into(), "eth2".into()]));

        let agent = resolve(argv(&["lbd", "agent", "--config", &path])).unwrap();
        let Some(crate::args::LbdCommand::Agent(a)) = &agent.args.command else { panic!("not the agent") };
        assert_eq!((a.iface.as_deref(), a.leak_after_s), (Some("eth3"), 7));

        // Without a file, the command line is what runs.
        let plain = resolve(argv(&["lbd", "--iface", "eth0"])).unwrap();
        assert!(plain.config.is_none());
        assert_eq!(plain.settings.effective, plain.settings.command_line);
        assert_eq!(plain.settings.effective.get("iface"), Some(&["eth0".to_owned()][..]));
    }

    #[test]
    fn the_environment_wins_over_the_file_and_the_command_line_over_both() {
        // lbd reads the variables from its environment: they are set for a child running this
        // test alone, so that no other test sees them.
        // The test's name as libtest knows it: its path without the crate's name.
        let (_, module) = module_path!().split_once("::").unwrap();
        let name = format!("{module}::the_environment_wins_over_the_file_and_the_command_line_over_both");
        if std::env::var_os("SPW_SETTINGS_ENV_CHILD").is_none() {
            let child = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--test-threads", "1"])
                .env("SPW_SETTINGS_ENV_CHILD", "1")
                .envs([("LBD_OUTER_SRC", "10.0.0.3"), ("LBD_ZONE", "b")])
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&child.stdout);
            assert!(child.status.success() && out.contains("1 passed"), "{out}{}", String::from_utf8_lossy(&child.stderr));
            return;
        }
        let tmp = TempDir::new("settings-env");
        let path = file(&tmp, "vips = []\n[lbd]\niface = \"eth0\"\nouter_src = \"10.0.0.2\"\nzone = \"a\"\nbird_socket = \"/b.ctl\"\n");
        let resolved = resolve(argv(&["lbd", "--config", &path])).unwrap();
        let effective = |key: &str| resolved.settings.effective.get(key).map(<[String]>::to_vec);
        assert_eq!(effective("outer_src"), Some(vec!["10.0.0.3".to_owned()]), "the variable wins over the file");
        assert_eq!(effective("zone"), Some(vec!["b".to_owned()]));
        // A variable not set leaves the file's value.
        assert_eq!(effective("bird_socket"), Some(vec!["/b.ctl".to_owned()]));
        assert_eq!(resolved.settings.command_line.get("outer_src"), Some(&["10.0.0.3".to_owned()][..]), "shown as overriding the file");
        let resolved = resolve(argv(&["lbd", "--config", &path, "--zone", "c"])).unwrap();
        assert_eq!(resolved.args.daemon.zone.as_deref(), Some("c"), "the command line wins over the variable");
    }

    #[test]
    fn cleanup_takes_its_paths_from_the_file_and_the_command_line_wins() {
        let tmp = TempDir::new("settings-cleanup");
        let path = file(
            &tmp,
            "vips = []\n[lbd]\niface = \"eth9\"\npin_dir = \"/sys/fs/bpf/file\"\nbird_socket = \"/run/b.ctl\"\n\
             bird_include = \"/run/inc.conf\"\nprobe_device = \"probe9\"\n",
        );
        let d = resolve(argv(&["lbd", "--cleanup", "--config", &path])).unwrap().args.daemon;
        assert!(d.cleanup);
        assert_eq!(d.pin_dir, std::path::PathBuf::from("/sys/fs/bpf/file"));
        assert_eq!(d.announce.bird_socket.as_deref(), Some(std::path::Path::new("/run/b.ctl")));
        assert_eq!(d.announce.bird_include, std::path::PathBuf::from("/run/inc.conf"));
        assert_eq!(d.vip_path.probe_device.as_deref(), Some("probe9"));
        let d = resolve(argv(&["lbd", "--cleanup", "--config", &path, "--pin-dir", "/sys/fs/bpf/cli"])).unwrap().args.daemon;
        assert_eq!(d.pin_dir, std::path::PathBuf::from("/sys/fs/bpf/cli"), "the command line wins");
        // An interface on the command line still makes no sense with --cleanup.
        assert!(resolve(argv(&["lbd", "--cleanup", "--config", &path, "--iface", "eth0"])).is_err());
    }

    #[test]
    fn notes_name_settings_that_wait_for_a_restart() {
        let running = RunningSettings {
            effective: Settings(BTreeMap::from([("zone".to_owned(), vec!["a".to_owned()]), ("iface".to_owned(), vec!["eth0".to_owned()])])),
            command_line: Settings::default(),
        };
        let file = Settings(BTreeMap::from([
            ("zone".to_owned(), vec!["b".to_owned()]),
            ("iface".to_owned(), vec!["eth0".to_owned()]),
            ("agent_port".to_owned(), vec!["1".to_owned()]),
        ]));
        assert_eq!(
            running.notes(&file),
            [
                "lbd.agent_port: the file says 1, lbd runs with its default: takes effect when lbd restarts",
                "lbd.zone: the file says b, lbd runs with a: takes effect when lbd restarts",
            ]
        );
    }

    #[test]
    fn bad_settings_are_refused_with_their_place() {
        let tmp = TempDir::new("settings-bad");
        for (text, message) in [
            ("[lbd]\nifac = \"eth0\"\n", ":3:8: lbd.ifac: unknown setting of lbd; the settings are log_format, iface, xdp_mode"),
            ("[lbd]\niface = \"eth0\"\ncleanup = true\n", ":4:11: lbd.cleanup: unknown setting of lbd"),
            ("[lbd]\nconfig = \"/x\"\n", "lbd.config: unknown setting"),
            ("[lbd]\nouter_src6 = \"fd00::/64\"\n", ":3:14: lbd.outer_src6: invalid value 'fd00::/64' for '--outer-src6 <ADDR[/PREFIX]>'"),
            ("[lbd]\nxdp_mode = \"offload\"\n", "lbd.xdp_mode: invalid value 'offload' for '--xdp-mode <XDP_MODE>'"),
            ("[lbd]\ntcp_idle_timeout_s = 0\n", "lbd.tcp_idle_timeout_s: invalid value '0' for '--tcp-idle-timeout-s <S>'"),
            ("[lbd]\necho_per_source = 2000000\n", "lbd.echo_per_source: invalid value '2000000' for '--echo-per-source <N>'"),
            ("[lbd]\necho_total = -1\n", "lbd.echo_total: invalid value '-1' for '--echo-total <N>'"),
            ("[lbd]\nzone = \"Zone A\"\n", "lbd.zone: invalid value 'Zone A' for '--zone <ZONE>': zone \"Zone A\""),
            ("[lbd]\nno_health_checks = \"yes\"\n", ":3:20: lbd.no_health_checks: expected true or false, found string"),
            ("[lbd]\ntx_iface = [[\"eth1\"]]\n", "lbd.tx_iface: expected a string or a number, found array"),
            ("[agent]\nports_listen = \"nowhere\"\n", "agent.ports_listen: invalid value 'nowhere'"),
            ("[agent]\nzone = \"a\"\n", "agent.zone: unknown setting of agent"),
        ] {
            let path = file(&tmp, &format!("vips = []\n{text}"));
            let err = resolve(argv(&["lbd", "--config", &path])).and_then(|_| resolve(argv(&["lbd", "agent", "--config", &path])));
            let err = err.map(|_| ()).unwrap_err().to_string();
            assert!(err.starts_with(&path) && err.contains(message), "{text:?}: {err}\n  lacks {message:?}");
        }
        // The echo answers' rates reach the data path's configuration as set (0: none).
        let path = file(&tmp, "vips = []\n[lbd]\necho_per_source = 0\necho_total = 20\n");
        let resolved = resolve(argv(&["lbd", "--config", &path])).unwrap();
        assert_eq!(resolved.args.daemon.echo_config(), spillway_common::types::EchoConfig::new(0, 20));
        // The file is read whole before anything else: a bad state is refused by the caller,
        // a missing --iface here.
        let path = file(&tmp, "vips = []\n");
        let resolved = resolve(argv(&["lbd", "--config", &path])).unwrap();
        assert!(resolved.args.daemon.iface.is_empty());
        assert!(matches!(resolve(argv(&["lbd", "--config", "/nonexistent.toml"])), Err(crate::resolve::ArgsError::Config(_))));
    }
}
