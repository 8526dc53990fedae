//! The file's shape: one struct per table, each field one field of the model (or one
//! command-line option, in `[lbd]` and `[agent]`), and the conversions to and from the
//! model's `DesiredState`. The model does every check; this module only says which field of
//! the file a refusal is about.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};
use spillway_common::limits::DEFAULT_RING_SIZE;
use toml::value::Datetime;

use super::{datetime, locate::FieldPath};
use crate::{
    Backend, BackendOptions, Cidr, DEFAULT_WEIGHT, DesiredState, Encap, HashMode, HealthConfig, LimitConfig, ModelError, ProbePath,
    ProbeSpec, QuicConfig, RuleActionKind, RuleConfig, RuleMatch, Vip, VipConfig, VipHealth, check_serving_weight,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `lbd`'s own settings: option names without `--`, `-` written `_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lbd: Option<toml::Table>,
    /// `lbd agent`'s settings, the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<toml::Table>,
    /// The default new-flow limits (`DesiredState::default_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitConfig>,
    #[serde(default)]
    pub vips: Vec<FileVip>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<FileRule>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileVip {
    pub vip: Vip,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<FileHealth>,
    /// The VIP is on an address of the balancer itself, on purpose.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_local_address: bool,
    /// A QUIC VIP (UDP) and its QUIC-LB configuration: `quic = {}` takes the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicConfig>,
    /// A second config id beside `quic` while a key is rotated (its own `key_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic_next: Option<QuicConfig>,
    /// `ipip` (the default) or `gue`: how its backends are tunnelled to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
    /// `"5-tuple"` (the default) or `"source"`: what Maglev hashes to place new flows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashMode>,
    /// With `hash = "source"`: how many leading source address bits (the whole address
    /// when left out; 64 keeps an IPv6 client's privacy addresses together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_prefix: Option<u8>,
    #[serde(default)]
    pub backends: Vec<FileBackend>,
}

/// A VIP's health checks; policy fields left out take the built-in defaults (never the
/// flags of the `lbd` reading the file, so a file means the same on every balancer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHealth {
    #[serde(default)]
    pub probe: ProbeSpec,
    /// Tunnel (the default) or direct.
    #[serde(default, skip_serializing_if = "ProbePath::is_tunnel")]
    pub probe_path: ProbePath,
    #[serde(default, skip_serializing_if = "all_default", serialize_with = "changed_policy_fields")]
    pub policy: Option<HealthConfig>,
}

fn all_default(policy: &Option<HealthConfig>) -> bool {
    policy.as_ref().is_none_or(|p| *p == HealthConfig::default())
}

/// Only the policy fields that differ from the built-in defaults, which apply to the rest.
fn changed_policy_fields<S: serde::Serializer>(policy: &Option<HealthConfig>, s: S) -> Result<S::Ok, S::Error> {
    let table = |p: &HealthConfig| toml::Table::try_from(p).map_err(serde::ser::Error::custom);
    let defaults = table(&HealthConfig::default())?;
    let mut fields = match policy {
        Some(policy) => table(policy)?,
        None => toml::Table::new(),
    };
    fields.retain(|field, value| defaults.get(field) != Some(value));
    fields.serialize(s)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBackend {
    pub address: IpAddr,
    /// 1..=`MAX_WEIGHT`; kept but not used while `drain` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Weight 0: existing flows stay, new ones go elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline: Option<Datetime>,
    /// When it started serving (the wall-clock start of its slow start); `lbctl apply -f`
    /// writes the one `lbd` gave into a file that has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Datetime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_per_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_per_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_target: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_path: Option<ProbePath>,
    /// This backend's tunnel, when not its VIP's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRule {
    pub cidr: Cidr,
    /// Only new flows to this VIP; every VIP when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<Vip>,
    pub action: RuleActionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe: bool,
}

/// A refusal: the field it is about and why.
pub type Refusal = (FieldPath, String);

impl ConfigFile {
    /// The desired state the file declares, built with the model's checked edits.
    pub fn desired_state(&self) -> Result<DesiredState, Refusal> {
        let mut state = DesiredState::default();
        for (i, v) in self.vips.iter().enumerate() {
            let at = FieldPath::default().key("vips").index(i);
            if let Some(first) = self.vips[..i].iter().position(|other| other.vip == v.vip) {
                return Err((at.key("vip"), format!("VIP {} is declared twice (first in vips[{first}])", v.vip)));
            }
            state.add_vip(v.vip, v.ring_size.unwrap_or(DEFAULT_RING_SIZE)).map_err(|e| refusal(&at, e))?;
            state.allow_local_address(&v.vip, v.allow_local_address).map_err(|e| refusal(&at, e))?;
            state.set_quic(&v.vip, v.quic.clone()).map_err(|e| refusal(&at, e))?;
            state.set_quic_next(&v.vip, v.quic_next.clone()).map_err(|e| (at.clone().key("quic_next"), e.to_string()))?;
            state.set_encap(&v.vip, v.encap.unwrap_or_default()).map_err(|e| refusal(&at, e))?;
            state.set_hash(&v.vip, v.hash.unwrap_or_default(), v.source_prefix).map_err(|e| refusal(&at, e))?;
            if let Some(health) = &v.health {
                let health = health.to_model();
                // Checked here rather than by `set_health`, whose error does not name the field.
                health.probe.validate().map_err(|e| (at.clone().keys("health.probe").key(e.field()), e.to_string()))?;
                health.policy.validate().map_err(|e| (at.clone().keys("health.policy").key(e.field()), e.to_string()))?;
                state.set_health(&v.vip, Some(health)).map_err(|e| refusal(&at.clone().key("health"), e))?;
            }
            if let Some(limits) = v.limits {
                state.set_limits(Some(&v.vip), limits).map_err(|e| refusal(&at.clone().key("limits"), e))?;
            }
            for (j, b) in v.backends.iter().enumerate() {
                let at = at.clone().key("backends").index(j);
                if let Some(first) = v.backends[..j].iter().position(|other| other.address == b.address) {
                    let message = format!("backend {} is declared twice in VIP {} (first in backends[{first}])", b.address, v.vip);
                    return Err((at.key("address"), message));
                }
                state.add_backend_with(&v.vip, b.address, b.to_model(&at)?).map_err(|e| refusal(&at, e))?;
            }
        }
        if let Some(limits) = self.limits {
            state.set_limits(None, limits).map_err(|e| refusal(&FieldPath::default().key("limits"), e))?;
        }
        for (k, r) in self.rules.iter().enumerate() {
            let at = FieldPath::default().key("rules").index(k);
            let rule = RuleMatch { cidr: r.cidr, vip: r.vip };
            if let Some(first) = self.rules[..k].iter().position(|other| (other.cidr, other.vip) == (r.cidr, r.vip)) {
                return Err((at.key("cidr"), format!("rule {} is declared twice (first in rules[{first}])", rule.describe())));
            }
            let config = RuleConfig::from_parts(&rule, r.action, r.per_s, r.burst, r.observe).map_err(|e| refusal(&at, e))?;
            state.set_rule(rule, config).map_err(|e| refusal(&at, e))?;
        }
        Ok(state)
    }

    /// The file that declares `state` (every value explicit, so it means the same whatever
    /// the defaults of a later version).
    pub fn from_state(state: &DesiredState) -> Self {
        let vips = state.vips.iter().map(|(vip, config)| FileVip::from_model(vip, config)).collect();
        let rules = state
            .rules
            .iter()
            .map(|(rule, config)| {
                let (action, rate) = config.parts();
                FileRule {
                    cidr: rule.cidr,
                    vip: rule.vip,
                    action,
                    per_s: rate.map(|r| r.per_s),
                    burst: rate.map(|r| r.burst),
                    observe: config.observe,
                }
            })
            .collect();
        Self { lbd: None, agent: None, limits: state.default_limits, vips, rules }
    }
}

impl FileVip {
    pub fn from_model(vip: &Vip, config: &VipConfig) -> Self {
        let VipConfig { ring_size, backends, limits, health, allow_local_address, quic, quic_next, encap, hash, source_prefix } = config;
        Self {
            vip: *vip,
            quic: quic.clone(),
            quic_next: quic_next.clone(),
            encap: (!encap.is_ipip()).then_some(*encap),
            hash: (!hash.is_five_tuple()).then_some(*hash),
            source_prefix: *source_prefix,
            ring_size: Some(*ring_size),
            limits: *limits,
            allow_local_address: *allow_local_address,
            health: health.as_ref().map(|h| FileHealth {
                probe: h.probe.clone(),
                probe_path: h.probe_path,
                policy: Some(h.policy.clone()),
            }),
            backends: backends.iter().map(|(address, b)| FileBackend::from_model(*address, b)).collect(),
        }
    }
}

impl FileHealth {
    fn to_model(&self) -> VipHealth {
        VipHealth { probe: self.probe.clone(), probe_path: self.probe_path, policy: self.policy.clone().unwrap_or_default() }
    }
}

impl FileBackend {
    fn to_model(&self, at: &FieldPath) -> Result<Backend, Refusal> {
        let Self {
            address: _,
            weight,
            drain,
            drain_deadline,
            started_at,
            zone,
            capacity_per_s,
            spare_per_s,
            probe_target,
            probe_path,
            encap,
        } = self;
        let weight = match drain {
            true => 0,
            false => check_serving_weight(weight.unwrap_or(DEFAULT_WEIGHT)).map_err(|e| {
                let hint = if *weight == Some(0) { "; a draining backend is written drain = true" } else { "" };
                (at.clone().key("weight"), format!("{e}{hint}"))
            })?,
        };
        let drain_deadline_unix_ms =
            drain_deadline.as_ref().map(datetime::to_unix_ms).transpose().map_err(|e| (at.clone().key("drain_deadline"), e))?;
        let started_at_unix_ms =
            started_at.as_ref().map(datetime::to_unix_ms).transpose().map_err(|e| (at.clone().key("started_at"), e))?;
        let options = BackendOptions {
            zone: zone.clone(),
            capacity_per_s: *capacity_per_s,
            spare_per_s: *spare_per_s,
            probe_target: *probe_target,
            probe_path: *probe_path,
            encap: *encap,
        };
        Ok(Backend { weight, options, drain_deadline_unix_ms, started_at_unix_ms })
    }

    pub fn from_model(address: IpAddr, backend: &Backend) -> Self {
        let Backend { weight, options, drain_deadline_unix_ms, started_at_unix_ms } = backend;
        let BackendOptions { zone, capacity_per_s, spare_per_s, probe_target, probe_path, encap } = options.clone();
        Self {
            address,
            weight: (*weight != 0).then_some(*weight),
            drain: *weight == 0,
            drain_deadline: drain_deadline_unix_ms.map(datetime::from_unix_ms),
            started_at: started_at_unix_ms.map(datetime::from_unix_ms),
            zone,
            capacity_per_s,
            spare_per_s,
            probe_target,
            probe_path,
            encap,
        }
    }
}

/// `error` as a refusal of the field (under `at`) it is about.
fn refusal(at: &FieldPath, error: ModelError) -> Refusal {
    (at.clone().keys(field_of(&error)), error.to_string())
}

/// The field (relative to the table being added) a model error is about; "" for the table.
fn field_of(error: &ModelError) -> &'static str {
    use ModelError as E;
    match error {
        E::WeightOutOfRange { .. } | E::ServingWeightOutOfRange { .. } => "weight",
        E::DuplicateVip { .. } | E::BadVip { .. } => "vip",
        E::DuplicateBackend { .. } | E::FamilyMismatch { .. } | E::BadBackendAddress { .. } | E::QuicServerIdTaken { .. } => "address",
        E::QuicNotUdp { .. } | E::BadQuic { .. } => "quic",
        E::SourcePrefixWithoutSourceHash { .. } | E::SourcePrefixOutOfRange { .. } => "source_prefix",
        E::BadRingSize { .. } => "ring_size",
        E::BadZone { .. } => "zone",
        E::SpareWithoutCapacity { .. } | E::SpareAboveCapacity { .. } => "spare_per_s",
        E::BadProbeTarget { .. } => "probe_target",
        E::DeadlineWithoutDrain { .. } => "drain_deadline",
        E::StartWithoutWeight { .. } => "started_at",
        E::BadCidr { .. }
        | E::CidrPrefixOutOfRange { .. }
        | E::CidrHostBits { .. }
        | E::RuleFamilyMismatch { .. }
        | E::TooManyRuleLengths { .. } => "cidr",
        // A rule naming a VIP the file does not declare.
        E::UnknownVip { .. } => "vip",
        E::BadRule { problem, .. } if problem.contains("burst") => "burst",
        E::BadRule { .. } => "per_s",
        // `field` is "<scope>: <name>" or "backend <ip> <name>": the name is the last word.
        E::BadRate { field, .. } => match field.rsplit([' ', ':']).next().unwrap_or("") {
            "per_source" => "per_source.per_s",
            "vip_budget" => "vip_budget.per_s",
            "capacity_per_s" => "capacity_per_s",
            _ => "per_s",
        },
        E::BadPrefixLen { field, .. } if field.ends_with("source_prefix_v6") => "source_prefix_v6",
        E::BadPrefixLen { .. } => "source_prefix_v4",
        E::EmptyLimits { .. }
        | E::TooManyVips
        | E::TooManyBackendsInVip { .. }
        | E::TooManyBackends
        | E::TooManyRules
        | E::UnknownBackend { .. }
        | E::UnknownRule { .. }
        | E::BadRuleMatch { .. }
        | E::BadHealth { .. } => "",
    }
}
