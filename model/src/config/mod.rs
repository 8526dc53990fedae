//! The configuration file: one TOML document with the whole desired state (VIPs and their
//! backends, limits, rules) and the settings of `lbd` (`[lbd]`) and `lbd agent` (`[agent]`),
//! one key per command-line option. `deploy/spillway.toml` documents every field.
//!
//! A file is checked whole before anything changes: [`Document::parse`] checks the syntax,
//! the types and the field names, [`Document::desired_state`] builds the state with the
//! model's own checks. A refusal names the file, line, column and field path
//! (`spillway.toml:14:10: vips[2].backends[0].weight: ...`). [`export`] writes a state back
//! as such a file, and [`diff`] lists what going from one state to another changes.

mod datetime;
mod diff;
mod file;
mod locate;

use std::{fmt, fs::File, io::Read, net::IpAddr, path::Path};

pub use diff::{Change, ChangeKind, FieldChange, Item, diff};
pub use locate::FieldPath;
use toml::de::DeTable;

use self::file::ConfigFile;
use crate::{DesiredState, Vip};

/// Largest file accepted (a thousand VIPs of ten backends each, commented, take ~1 MiB).
pub const MAX_CONFIG_BYTES: usize = 4 << 20;

/// A refused file: where, which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    /// 1-based line and column, when the problem has a place.
    pub place: Option<(usize, usize)>,
    /// The field path (`vips[2].backends[0].weight`); empty for the whole file.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((line, column)) = self.place {
            write!(f, ":{line}:{column}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A parsed file: its text (to place later refusals) and its tables.
#[derive(Clone, Debug)]
pub struct Document {
    name: String,
    text: String,
    file: ConfigFile,
}

impl Document {
    /// Reads and parses `path` (at most [`MAX_CONFIG_BYTES`]).
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let refuse = |message: String| ConfigError { file: name.clone(), place: None, path: String::new(), message };
        let mut bytes = Vec::new();
        File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES as u64 + 1).read_to_end(&mut bytes))
            .map_err(|e| refuse(format!("reading it: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let valid = e.as_bytes().get(..e.utf8_error().valid_up_to()).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or("");
            ConfigError { place: Some(locate::line_column(valid, valid.len())), ..refuse("not UTF-8 text".to_owned()) }
        })?;
        Self::parse(&name, text)
    }

    /// Parses `text`, which came from `name` (for messages). Refuses more than
    /// [`MAX_CONFIG_BYTES`], syntax errors, unknown fields, wrong types and an empty file.
    pub fn parse(name: &str, text: String) -> Result<Self, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            let message = format!("larger than the {} MiB a configuration may be", MAX_CONFIG_BYTES >> 20);
            return Err(ConfigError { file: name.to_owned(), place: None, path: String::new(), message });
        }
        let file: ConfigFile = match toml::from_str(&text) {
            Ok(file) => file,
            Err(e) => {
                let (tree, _) = DeTable::parse_recoverable(&text);
                let span = e.span().unwrap_or_default();
                let path = e.span().map(|s| locate::path_at(&tree, s.start)).unwrap_or_default();
                let mut message = e.message().to_owned();
                // A duplicate key is not in the tree: name it.
                if let Some(snippet) =
                    text.get(span.clone()).filter(|s| path.is_empty() && !s.is_empty() && s.len() < 80 && !s.contains('\n'))
                {
                    message = format!("{message} `{snippet}`");
                }
                return Err(ConfigError {
                    file: name.to_owned(),
                    place: e.span().map(|s| locate::line_column(&text, s.start)),
                    path: path.to_string(),
                    message,
                });
            }
        };
        if DeTable::parse(&text).is_ok_and(|tree| tree.get_ref().is_empty()) {
            let message = "declares nothing; a file for a balancer without VIPs says so: vips = []".to_owned();
            return Err(ConfigError { file: name.to_owned(), place: None, path: String::new(), message });
        }
        Ok(Self { name: name.to_owned(), text, file })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `[lbd]` table: option names (without `--`, `_` for `-`) to values.
    pub fn lbd(&self) -> Option<&toml::Table> {
        self.file.lbd.as_ref()
    }

    /// The `[agent]` table, the same way.
    pub fn agent(&self) -> Option<&toml::Table> {
        self.file.agent.as_ref()
    }

    /// Whether the file holds nothing but an `[agent]` table: a backend's file (`lbd agent
    /// --config`), with no balancer in it to check.
    pub fn is_agent_only(&self) -> bool {
        DeTable::parse(&self.text).is_ok_and(|tree| tree.get_ref().keys().all(|key| key.get_ref() == "agent"))
    }

    /// The desired state the file declares, checked by the model.
    pub fn desired_state(&self) -> Result<DesiredState, ConfigError> {
        self.file.desired_state().map_err(|(path, message)| self.refuse(&path, message))
    }

    /// The path of a VIP's `vip` field in the file, or of its backend's `address`.
    pub fn field_of(&self, vip: &Vip, backend: Option<IpAddr>) -> FieldPath {
        let Some(i) = self.file.vips.iter().position(|v| v.vip == *vip) else { return FieldPath::default() };
        let at = FieldPath::default().key("vips").index(i);
        match backend.and_then(|b| self.file.vips[i].backends.iter().position(|fb| fb.address == b)) {
            Some(j) => at.key("backends").index(j).key("address"),
            None => at.key("vip"),
        }
    }

    /// A refusal of the field at `path`, placed in the text.
    pub fn refuse(&self, path: &FieldPath, message: String) -> ConfigError {
        let tree = DeTable::parse(&self.text).ok();
        let place = tree.map(|tree| locate::line_column(&self.text, locate::span_of(&tree, path).start));
        ConfigError { file: self.name.clone(), place, path: path.to_string(), message }
    }
}

/// `text` (the file `name`) with a line `started_at = TIME` after the `address` line of each
/// backend of `starts` (VIP, backend, Unix ms): how `lbctl apply` writes the starts `lbd`
/// gave into the file, so that every balancer given it ramps those backends alike. Comments
/// and layout are kept. Refused (nothing written) unless the result declares exactly the
/// file's state with those starts (say, a backend written as an inline table).
pub fn with_starts(name: &str, text: &str, starts: &[(Vip, IpAddr, u64)]) -> Result<String, String> {
    let doc = Document::parse(name, text.to_owned()).map_err(|e| e.to_string())?;
    let mut want = doc.desired_state().map_err(|e| e.to_string())?;
    let tree = DeTable::parse(text).map_err(|e| e.to_string())?;
    let mut inserts = Vec::new();
    for (vip, backend, at) in starts {
        let declared = want.vips.get_mut(vip).and_then(|c| c.backends.get_mut(backend));
        let Some(declared) = declared.filter(|b| b.started_at_unix_ms.is_none()) else {
            return Err(format!("{name} declares no backend {backend} of {vip} without started_at"));
        };
        declared.started_at_unix_ms = Some(*at);
        let address = locate::span_of(&tree, &doc.field_of(vip, Some(*backend)));
        let end_of_line = text[address.end..].find('\n').map_or(text.len(), |i| address.end + i);
        inserts.push((end_of_line, format!("\nstarted_at = {}", datetime::from_unix_ms(*at))));
    }
    inserts.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let mut out = text.to_owned();
    for (at, line) in inserts {
        out.insert_str(at, &line);
    }
    let written = Document::parse(name, out.clone()).and_then(|d| d.desired_state()).map_err(|e| e.to_string())?;
    if written != want {
        return Err("its backends are not written one [[vips.backends]] table each with address on a line of its own".to_owned());
    }
    Ok(out)
}

/// Unix milliseconds as the file writes a time (`2026-12-01T10:00:00.5Z`).
pub fn format_unix_ms(ms: u64) -> String {
    datetime::from_unix_ms(ms).to_string()
}

/// `state` as a configuration file (with `lbd` as its `[lbd]` table): what `lbctl export`
/// prints. Applying it changes nothing. Health policy fields at their defaults are left out.
pub fn export(state: &DesiredState, lbd: Option<toml::Table>) -> String {
    let file = ConfigFile { lbd, ..ConfigFile::from_state(state) };
    let body = toml::to_string_pretty(&file).unwrap_or_else(|e| format!("# not exported: {e}\n"));
    format!("# Spillway configuration exported from lbd; every field is described in spillway.toml.\n\n{body}")
}

#[cfg(test)]
mod tests;
