//! Log lines: every line `lbd` and the agent write goes through [`init`]'s formatter, as one
//! logfmt line (`ts=… level=info event=health_state vip=… reason="probe timed out"`) or, with
//! `--log-format json`, one JSON object with the same keys (values as strings).
//!
//! Call sites build their message with [`event!`](crate::event): an event name and
//! `key = value` fields, each value quoted when it needs to be, so a line always parses.
//! A message that does not start with `event=` (a library's) is kept whole under `msg`.

use std::{borrow::Cow, fmt, io::Write};

use clap::ValueEnum;

mod error_chain;
pub use error_chain::error_chain;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `key=value` pairs (logfmt).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Logs one event line: `event!(info, "backend_added", vip = vip, backend = addr)`.
/// Values are anything `Display`; the line is only built when the level is enabled.
#[macro_export]
macro_rules! event {
    ($level:ident, $name:expr $(, $key:ident = $value:expr)* $(,)?) => {
        ::log::$level!("{}", $crate::Line::new($name)$(.field(stringify!($key), &$value))*)
    };
}

/// An event line being built (see [`event!`](crate::event)).
#[derive(Clone, Debug)]
pub struct Line(String);

impl Line {
    pub fn new(event: &str) -> Self {
        let mut line = String::from("event=");
        push_value(&mut line, event);
        Line(line)
    }

    pub fn field(mut self, key: &str, value: &dyn fmt::Display) -> Self {
        self.0.push(' ');
        self.0.push_str(key);
        self.0.push('=');
        push_value(&mut self.0, &value.to_string());
        self
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `value` as a logfmt value: bare when it is a plain token, else double-quoted with `"`,
/// `\` and control characters escaped (so one event is always one line).
pub fn quote(value: &str) -> Cow<'_, str> {
    let plain = !value.is_empty() && value.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
    if plain {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    Cow::Owned(out)
}

fn push_value(line: &mut String, value: &str) {
    line.push_str(&quote(value));
}

/// Splits a logfmt line into its pairs; `None` if it is not one (a bare word, an open quote).
pub fn parse(line: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = &rest[..eq];
        if key.is_empty() || key.contains(char::is_whitespace) {
            return None;
        }
        rest = &rest[eq + 1..];
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i + 1,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        't' => value.push('\t'),
                        'u' => {
                            let hex: String = chars.by_ref().map(|(_, c)| c).skip(1).take_while(|c| *c != '}').collect();
                            value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        }
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            rest = &quoted[end..];
            value
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            let value = rest[..end].to_owned();
            rest = &rest[end..];
            value
        };
        if !rest.is_empty() && !rest.starts_with(' ') {
            return None;
        }
        pairs.push((key.to_owned(), value));
        rest = rest.trim_start();
    }
    Some(pairs)
}

/// The fields of one record as written: time, level, then the event's pairs (or `target`
/// and `msg` for a message that is not an event line).
fn fields(ts: String, record: &log::Record<'_>) -> Vec<(String, String)> {
    let message = record.args().to_string();
    let mut fields = vec![("ts".to_owned(), ts), ("level".to_owned(), record.level().as_str().to_ascii_lowercase())];
    match parse(&message).filter(|pairs| pairs.first().is_some_and(|(k, _)| k == "event")) {
        Some(pairs) => fields.extend(pairs),
        None => {
            fields.push(("target".to_owned(), record.target().to_owned()));
            fields.push(("msg".to_owned(), message));
        }
    }
    fields
}

/// Renders the fields as one logfmt or JSON line (without the newline).
pub fn render(format: LogFormat, fields: &[(String, String)]) -> String {
    match format {
        LogFormat::Text => fields.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect::<Vec<_>>().join(" "),
        LogFormat::Json => {
            let object: serde_json::Map<String, serde_json::Value> =
                fields.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
            serde_json::Value::Object(object).to_string()
        }
    }
}

/// Installs the logger (level from `RUST_LOG`, default `info`) writing `format` to stderr.
pub fn init(format: LogFormat) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(move |buf, record| {
            let ts = buf.timestamp_millis().to_string();
            writeln!(buf, "{}", render(format, &fields(ts, record)))
        })
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_only_when_needed() {
        let line = Line::new("health_state")
            .field("vip", &"10.0.0.1:80/tcp")
            .field("reason", &"probe timed out")
            .field("empty", &"")
            .field("tricky", &"a=\"b\"\\\n");
        assert_eq!(line.to_string(), r#"event=health_state vip=10.0.0.1:80/tcp reason="probe timed out" empty="" tricky="a=\"b\"\\\n""#);
        let pairs = parse(&line.to_string()).unwrap();
        assert_eq!(pairs[2], ("reason".to_owned(), "probe timed out".to_owned()));
        assert_eq!(pairs[4], ("tricky".to_owned(), "a=\"b\"\\\n".to_owned()));
        assert_eq!(parse(&Line::new("x").field("c", &"\u{1}").to_string()).unwrap()[1].1, "\u{1}");
    }

    #[test]
    fn free_text_is_not_an_event() {
        for text in ["took over the link", "a=b c", "a=\"open", "a=\"b\"c", "=x"] {
            assert!(parse(text).is_none_or(|p| p.len() < 2 || p[0].0 != "event"), "{text}");
        }
    }

    #[test]
    fn records_render_as_logfmt_and_json() {
        let args = format_args!("{}", Line::new("ready").field("api", &"/run/spillway/api.sock").field("note", &"two words"));
        let record = log::Record::builder().args(args).level(log::Level::Info).target("spillway_daemon").build();
        let fields = fields("2026-01-01T00:00:00.000Z".to_owned(), &record);
        assert_eq!(
            render(LogFormat::Text, &fields),
            r#"ts=2026-01-01T00:00:00.000Z level=info event=ready api=/run/spillway/api.sock note="two words""#
        );
        let json: serde_json::Value = serde_json::from_str(&render(LogFormat::Json, &fields)).unwrap();
        assert_eq!(json["event"], "ready");
        assert_eq!(json["note"], "two words");
        assert_eq!(json["level"], "info");

        let args = format_args!("a library's free text");
        let record = log::Record::builder().args(args).level(log::Level::Warn).target("aya::maps").build();
        let json: serde_json::Value = serde_json::from_str(&render(LogFormat::Json, &self::fields("t".to_owned(), &record))).unwrap();
        assert_eq!(
            (json["msg"].as_str(), json["target"].as_str(), json["level"].as_str()),
            (Some("a library's free text"), Some("aya::maps"), Some("warn"))
        );
    }
}
