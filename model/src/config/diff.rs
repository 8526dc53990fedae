//! What going from one desired state to another changes: one entry per VIP, backend, rule or
//! the default limits added, removed or changed, with the fields that differ named as in the
//! file (`health.policy.fall`, `weight`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

use super::file::{ConfigFile, FileBackend, FileHealth, FileRule, FileVip};
use crate::{DesiredState, HealthConfig, ProbePath, ProbeSpec, Vip};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub change: ChangeKind,
    pub item: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<Vip>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<IpAddr>,
    /// `CIDR` or `CIDR@VIP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// An added item's fields, a changed one's differences (health policy fields at their
    /// defaults are left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldChange>,
    /// Set by a dry run on a change the apply would refuse, saying why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Item {
    DefaultLimits,
    Vip,
    Backend,
    Rule,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    pub field: String,
    /// Absent: the field was not set (its default applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<serde_json::Value>,
}

/// Every change from `old` to `new`: the default limits, then VIP by VIP (a VIP before its
/// backends), then rules.
pub fn diff(old: &DesiredState, new: &DesiredState) -> Vec<Change> {
    let (old, new) = (ConfigFile::from_state(old), ConfigFile::from_state(new));
    let mut changes = Vec::new();
    let item = |change, item| Change { change, item, vip: None, backend: None, rule: None, fields: Vec::new(), refused: None };
    compare(&mut changes, item(ChangeKind::Changed, Item::DefaultLimits), old.limits.as_ref(), new.limits.as_ref());

    let (old_vips, new_vips) = (keyed(&old.vips, |v| v.vip), keyed(&new.vips, |v| v.vip));
    for vip in union(&old_vips, &new_vips) {
        let (before, after) = (old_vips.get(&vip).copied(), new_vips.get(&vip).copied());
        let template = Change { vip: Some(vip), ..item(ChangeKind::Changed, Item::Vip) };
        compare(&mut changes, template, before.map(without_backends).as_ref(), after.map(without_backends).as_ref());
        let (old_backends, new_backends) = (keyed(backends(before), |b| b.address), keyed(backends(after), |b| b.address));
        for address in union(&old_backends, &new_backends) {
            let template = Change { vip: Some(vip), backend: Some(address), ..item(ChangeKind::Changed, Item::Backend) };
            compare(&mut changes, template, old_backends.get(&address).copied(), new_backends.get(&address).copied());
        }
    }
    let (old_rules, new_rules) = (keyed(&old.rules, rule_name), keyed(&new.rules, rule_name));
    for name in union(&old_rules, &new_rules) {
        let template = Change { rule: Some(name.clone()), ..item(ChangeKind::Changed, Item::Rule) };
        compare(&mut changes, template, old_rules.get(&name).copied(), new_rules.get(&name).copied());
    }
    changes
}

fn keyed<K: Ord, T>(items: &[T], key: impl Fn(&T) -> K) -> BTreeMap<K, &T> {
    items.iter().map(|item| (key(item), item)).collect()
}

/// The keys of either map, in order.
fn union<K: Ord + Clone, V>(a: &BTreeMap<K, V>, b: &BTreeMap<K, V>) -> BTreeSet<K> {
    a.keys().chain(b.keys()).cloned().collect()
}

fn rule_name(rule: &FileRule) -> String {
    match rule.vip {
        Some(vip) => format!("{}@{vip}", rule.cidr),
        None => rule.cidr.to_string(),
    }
}

fn backends(vip: Option<&FileVip>) -> &[FileBackend] {
    vip.map_or(&[], |v| &v.backends)
}

fn without_backends(vip: &FileVip) -> FileVip {
    FileVip { backends: Vec::new(), ..vip.clone() }
}

/// Pushes the change from `old` to `new` of one item, if any. Health policy fields at their
/// defaults count as not set, like in an export.
fn compare<T: Serialize>(changes: &mut Vec<Change>, template: Change, old: Option<&T>, new: Option<&T>) {
    let defaults = default_policy_fields();
    let fields = |item: &T| {
        let mut fields = flatten(item);
        fields.retain(|field, value| field != "backends" && defaults.get(field) != Some(value));
        fields
    };
    let change = match (old, new) {
        (None, None) => return,
        (None, Some(new)) => {
            let fields = fields(new).into_iter().map(|(field, value)| FieldChange { field, from: None, to: Some(value) }).collect();
            Change { change: ChangeKind::Added, fields, ..template }
        }
        (Some(_), None) => Change { change: ChangeKind::Removed, ..template },
        (Some(old), Some(new)) => {
            let (mut old, new) = (fields(old), fields(new));
            let mut changed: Vec<FieldChange> = new
                .into_iter()
                .filter_map(|(field, to)| {
                    let from = old.remove(&field);
                    (from.as_ref() != Some(&to)).then_some(FieldChange { field, from, to: Some(to) })
                })
                .collect();
            changed.extend(old.into_iter().map(|(field, from)| FieldChange { field, from: Some(from), to: None }));
            if changed.is_empty() {
                return;
            }
            changed.sort_by(|a, b| a.field.cmp(&b.field));
            Change { change: ChangeKind::Changed, fields: changed, ..template }
        }
    };
    changes.push(change);
}

/// The built-in health policy as a VIP's flattened fields (`health.policy.fall` → 2): what
/// an added VIP's diff leaves out, like an export does.
fn default_policy_fields() -> BTreeMap<String, serde_json::Value> {
    let health = FileHealth { probe: ProbeSpec::default(), probe_path: ProbePath::Tunnel, policy: Some(HealthConfig::default()) };
    flatten(&health)
        .into_iter()
        .filter(|(field, _)| field.starts_with("policy."))
        .map(|(field, value)| (format!("health.{field}"), value))
        .collect()
}

/// The item's fields as dotted paths (`health.policy.fall`) to JSON values.
fn flatten<T: Serialize>(item: &T) -> BTreeMap<String, serde_json::Value> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, serde_json::Value>) {
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&path, value, out);
                }
            }
            other => {
                out.insert(prefix.to_owned(), to_json(other));
            }
        }
    }
    let mut out = BTreeMap::new();
    // Through the text: the value serializer does not keep datetimes as datetimes. Every
    // file type serializes to a table.
    if let Some(table) = toml::to_string(item).ok().and_then(|text| text.parse::<toml::Table>().ok()) {
        walk("", &toml::Value::Table(table), &mut out);
    }
    out
}

fn to_json(value: &toml::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        toml::Value::String(s) => J::String(s.clone()),
        toml::Value::Integer(i) => J::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        toml::Value::Boolean(b) => J::Bool(*b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(items) => J::Array(items.iter().map(to_json).collect()),
        toml::Value::Table(table) => J::Object(table.iter().map(|(k, v)| (k.clone(), to_json(v))).collect()),
    }
}

impl fmt::Display for Change {
    /// One line: `+ backend 10.0.1.1 in 10.0.0.1:80/tcp: weight=100`,
    /// `~ vip 10.0.0.1:80/tcp: ring_size 65537 -> 4099`, `- rule 10.0.0.0/8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = match self.change {
            ChangeKind::Added => '+',
            ChangeKind::Removed => '-',
            ChangeKind::Changed => '~',
        };
        write!(f, "{sign} ")?;
        match (self.item, &self.vip, &self.backend, &self.rule) {
            (Item::Backend, Some(vip), Some(backend), _) => write!(f, "backend {backend} in {vip}")?,
            (Item::Vip, Some(vip), _, _) => write!(f, "vip {vip}")?,
            (Item::Rule, _, _, Some(rule)) => write!(f, "rule {rule}")?,
            _ => write!(f, "default limits")?,
        }
        let value = |v: &Option<serde_json::Value>| v.as_ref().map_or("-".to_owned(), |v| v.to_string());
        for (i, field) in self.fields.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { ", " })?;
            match self.change {
                ChangeKind::Added => write!(f, "{}={}", field.field, value(&field.to))?,
                _ => write!(f, "{} {} -> {}", field.field, value(&field.from), value(&field.to))?,
            }
        }
        if let Some(why) = &self.refused {
            write!(f, " (refused: {why})")?;
        }
        Ok(())
    }
}
