//! Keeps a dashboard from rotting: the metric names, label names and label values its
//! PromQL queries use, checked against an exposition (classic text format) the endpoint
//! served. Only what the dashboard's queries use is understood: metric selectors with
//! matchers, and `by`/`without`/`on`/`ignoring` label lists.

use std::collections::BTreeSet;

/// One series of an exposition: its name and labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

/// The series of a text-format exposition (comments skipped; label values unescaped).
pub fn series(exposition: &str) -> Vec<Series> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let end = line.find(['{', ' '])?;
            let name = line[..end].to_owned();
            let labels = if line[end..].starts_with('{') { parse_labels(&line[end + 1..]).0 } else { Vec::new() };
            Some(Series { name, labels })
        })
        .collect()
}

/// `k="v",k2="v2"}`: the pairs, and where parsing stopped (after the closing brace).
fn parse_labels(text: &str) -> (Vec<(String, String)>, usize) {
    let mut labels = Vec::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i] == ',' || bytes[i] == ' ') {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] == '}' {
            return (labels, i + 1);
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_alphanumeric() || bytes[i] == '_') {
            i += 1;
        }
        let key: String = bytes[start..i].iter().collect();
        // The operator: =, !=, =~ or !~.
        while i < bytes.len() && matches!(bytes[i], '=' | '!' | '~' | ' ') {
            i += 1;
        }
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                if bytes[i] == '\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                value.push(bytes[i]);
                i += 1;
            }
            i += 1;
        }
        labels.push((key, value));
    }
}

/// What one query uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    pub metrics: BTreeSet<String>,
    /// (metric, label, value, exact): an exact matcher's value must exist.
    pub matchers: Vec<(String, String, String, bool)>,
    /// Labels of `by (...)` and the like: each must exist on one of the query's metrics.
    pub grouping: BTreeSet<String>,
}

pub fn uses(expr: &str, prefix: &str) -> Uses {
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    while i < chars.len() {
        if !(chars[i].is_alphabetic() || chars[i] == '_') || (i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let rest: String = chars[i..].iter().collect();
        let rest = rest.trim_start();
        if word.starts_with(prefix) {
            if let Some(inner) = rest.strip_prefix('{') {
                let exact = inner.split('}').next().unwrap_or_default();
                let (labels, _) = parse_labels(inner);
                // Exactness per matcher, from the operators in order.
                let ops: Vec<bool> = exact.split(',').map(|m| m.contains('=') && !m.contains("=~") && !m.contains("!")).collect();
                for (n, (key, value)) in labels.into_iter().enumerate() {
                    let exact = ops.get(n).copied().unwrap_or(false) && !value.contains('$');
                    uses.matchers.push((word.clone(), key, value, exact));
                }
            }
            uses.metrics.insert(word);
        } else if matches!(word.as_str(), "by" | "without" | "on" | "ignoring" | "group_left" | "group_right") && rest.starts_with('(') {
            let list = rest[1..].split(')').next().unwrap_or_default();
            uses.grouping.extend(list.split(',').map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()));
        }
    }
    uses
}

/// What `expr` uses that `exposition` lacks (empty: the query can work).
pub fn missing(expr: &str, prefix: &str, exposition: &[Series]) -> Vec<String> {
    let uses = uses(expr, prefix);
    let mut problems = Vec::new();
    fn of<'a>(exposition: &'a [Series], metric: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        exposition.iter().filter(move |s| s.name == metric)
    }
    let of = |metric| of(exposition, metric);
    for metric in &uses.metrics {
        if of(metric).next().is_none() {
            problems.push(format!("no series {metric}"));
        }
    }
    // Prometheus adds these to every series it scrapes.
    for (metric, label, value, exact) in uses.matchers.iter().filter(|(_, l, _, _)| !matches!(l.as_str(), "instance" | "job")) {
        if !of(metric).any(|s| s.labels.iter().any(|(k, _)| k == label)) {
            problems.push(format!("{metric} has no label {label}"));
        } else if *exact && !of(metric).any(|s| s.labels.iter().any(|(k, v)| k == label && v == value)) {
            problems.push(format!("{metric} has no series with {label}=\"{value}\""));
        }
    }
    for label in uses.grouping.iter().filter(|l| !matches!(l.as_str(), "instance" | "job")) {
        let has = uses.metrics.iter().any(|m| of(m).any(|s| s.labels.iter().any(|(k, _)| k == label)));
        if !has {
            problems.push(format!("no metric of the query has the label {label} it groups by"));
        }
    }
    problems
}

/// What `promtool check metrics` (Debian's prometheus package) says about `text`: empty
/// when it accepts it. Panics when promtool is missing: `./x setup` installs it.
pub fn promtool_check(text: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; ./x setup installs it)");
    child.stdin.take().expect("piped").write_all(text.as_bytes()).expect("writing to promtool");
    let out = child.wait_with_output().expect("waiting for promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() { String::new() } else { format!("({}) {said}", out.status) }
}

/// Every `expr` of a Grafana dashboard's panels (rows' nested panels included).
pub fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dashboard["panels"].as_array().map(|p| p.iter().collect()).unwrap_or_default();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push((title.clone(), expr.to_owned()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "# HELP x\n\
        spillway_packets_total{reason=\"drop_no_backend\",action=\"drop\"} 3\n\
        spillway_vip_panic{vip=\"10.0.0.1:80/tcp\"} 0\n\
        spillway_flow_table_entries 2\n";

    #[test]
    fn finds_what_queries_use_and_what_is_missing() {
        let s = series(EXPOSITION);
        assert_eq!(s[0].labels, [("reason".to_owned(), "drop_no_backend".to_owned()), ("action".to_owned(), "drop".to_owned())]);
        let ok = r#"sum by (reason) (rate(spillway_packets_total{action="drop", vip=~"$vip"}[1m])) + spillway_flow_table_entries"#;
        assert_eq!(missing(ok, "spillway_", &s), ["spillway_packets_total has no label vip"]);
        let fine = r#"max by (vip) (spillway_vip_panic{vip=~"$vip"}) or sum(rate(spillway_packets_total{action="drop"}[5m]))"#;
        assert!(missing(fine, "spillway_", &s).is_empty(), "{:?}", missing(fine, "spillway_", &s));
        let bad = r#"sum by (zone) (spillway_vip_panics_total) + spillway_packets_total{action="pass"}"#;
        let problems = missing(bad, "spillway_", &s);
        assert!(problems.contains(&"no series spillway_vip_panics_total".to_owned()), "{problems:?}");
        assert!(problems.contains(&"spillway_packets_total has no series with action=\"pass\"".to_owned()), "{problems:?}");
        assert!(problems.contains(&"no metric of the query has the label zone it groups by".to_owned()), "{problems:?}");
    }
}
