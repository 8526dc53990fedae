//! The desired state an operator declares: VIPs, their backends and weights, new-flow limits
//! and operator rules, and each VIP's health checks (the policy, `health.rs`; what a probe
//! is and what one found out, `probe.rs`). This is what `lbd` persists and what the reconciler turns into map
//! updates.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use spillway_common::{
    limits::{
        Capacity, DEFAULT_RING_SIZE, DEFAULT_SOURCE_PREFIX_V4, DEFAULT_SOURCE_PREFIX_V6, MAX_BACKENDS_PER_VIP, MAX_RULE_LENGTHS, MAX_RULES,
        valid_ring_size,
    },
    maglev::MAX_WEIGHT,
    types::{LIMIT_F_OBSERVE_BUDGET, LIMIT_F_OBSERVE_SOURCE, Limits, PROTO_TCP, PROTO_UDP, Rate},
};

mod affinity;
mod backend;
pub mod config;
mod health;
pub mod host;
pub mod ports_report;
mod probe;
mod quic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use affinity::{HashMode, check as check_hash};
pub use backend::{Backend, BackendOptions, Encap, MAX_ZONE_LEN, VipHealth, check_zone};
pub use health::{HealthConfig, HealthConfigError, MAX_DURATION_MS, MAX_JITTER, MAX_RISE_FALL};
pub use probe::{Hex, MAX_PAYLOAD, NotHex, ProbeOutcome, ProbePath, ProbeSpec, ProbeSpecError};
pub use quic::{DEFAULT_NONCE_LEN, DEFAULT_SERVER_ID_LEN, QuicConfig, server_id_of, server_ids};

/// Weight a backend gets when none is given.
pub const DEFAULT_WEIGHT: u32 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => PROTO_TCP,
            Proto::Udp => PROTO_UDP,
        }
    }
}

/// A service address: `10.0.0.1:80/tcp`, `[fd00::1]:53/udp`; port 0 means any port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Vip {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("VIP {input:?}: expected <IP>:<PORT>/<tcp|udp>, e.g. 10.0.0.1:80/tcp or [fd00::1]:443/tcp")]
    BadVip { input: String },
    #[error("unknown VIP {vip}")]
    UnknownVip { vip: Vip },
    #[error("VIP {vip} already exists")]
    DuplicateVip { vip: Vip },
    #[error("backend {backend} already exists in VIP {vip}")]
    DuplicateBackend { vip: Vip, backend: IpAddr },
    #[error("backend {backend} is not in VIP {vip}")]
    UnknownBackend { vip: Vip, backend: IpAddr },
    #[error("weight {weight} is out of range (0..={MAX_WEIGHT})")]
    WeightOutOfRange { weight: u32 },
    #[error("weight {weight} is out of range (1..={MAX_WEIGHT}); weight 0 is set by draining the backend")]
    ServingWeightOutOfRange { weight: u32 },
    #[error("ring size {size} must be a prime between 13 and 65537")]
    BadRingSize { size: u32 },
    #[error("too many VIPs (limit {})", Capacity::MAX.vips)]
    TooManyVips,
    #[error("too many backends in VIP {vip} (limit {MAX_BACKENDS_PER_VIP})")]
    TooManyBackendsInVip { vip: Vip },
    #[error("too many backends in total (limit {})", Capacity::MAX.backends)]
    TooManyBackends,
    #[error("backend {backend}: an IPv6 VIP needs an IPv6 backend (IPv6 cannot be carried in IPv4)")]
    FamilyMismatch { backend: IpAddr },
    #[error("backend address {backend} is not usable (unspecified, multicast or broadcast)")]
    BadBackendAddress { backend: IpAddr },
    #[error("{field}: {per_s} new flows per second is out of range (1..={MAX_RATE_PER_S}); a limit is removed with clear, not set to 0")]
    BadRate { field: String, per_s: u32 },
    #[error("{field}: prefix length {len} is out of range (1..={max})")]
    BadPrefixLen { field: String, len: u8, max: u8 },
    #[error("limits of {scope}: nothing to set (give a per-source limit or a new-flow budget)")]
    EmptyLimits { scope: String },
    #[error("CIDR {input:?}: expected <IP>/<LEN> or a bare address, e.g. 10.0.0.0/8 or 2001:db8::/32")]
    BadCidr { input: String },
    #[error("CIDR {input}: prefix length must be 0..={max} for this address family")]
    CidrPrefixOutOfRange { input: String, max: u8 },
    #[error("CIDR {input} has host bits set; did you mean {canonical}?")]
    CidrHostBits { input: String, canonical: String },
    #[error("rule {input:?}: expected <CIDR> or <CIDR>@<VIP>, e.g. 10.0.0.0/8@10.0.0.1:80/tcp")]
    BadRuleMatch { input: String },
    #[error("rule {cidr}: an IPv{cidr_family} CIDR never matches clients of the IPv{vip_family} VIP {vip}")]
    RuleFamilyMismatch { cidr: Cidr, vip: Vip, cidr_family: u8, vip_family: u8 },
    #[error("no rule for {rule}")]
    UnknownRule { rule: String },
    #[error("rule {rule}: {problem}")]
    BadRule { rule: String, problem: &'static str },
    #[error("too many rules (limit {MAX_RULES})")]
    TooManyRules,
    #[error(
        "rule {rule}: the {scope} IPv{family} rules would use more than {MAX_RULE_LENGTHS} distinct prefix lengths \
         (each length in use costs every new flow a lookup)"
    )]
    TooManyRuleLengths { rule: String, scope: String, family: u8 },
    #[error("zone {zone:?}: expected 1 to {MAX_ZONE_LEN} of a-z, 0-9, '.', '_', '-'")]
    BadZone { zone: String },
    #[error("backend {backend} spare_per_s: needs capacity_per_s too (spare is a share of capacity)")]
    SpareWithoutCapacity { backend: IpAddr },
    #[error("backend {backend} spare_per_s: {spare} exceeds capacity_per_s {capacity}")]
    SpareAboveCapacity { backend: IpAddr, spare: u32, capacity: u32 },
    #[error("backend {backend} probe_target {target}: needs a usable address and a port other than 0")]
    BadProbeTarget { backend: IpAddr, target: SocketAddr },
    #[error("backend {backend} drain_deadline: only a draining backend (weight 0) has one")]
    DeadlineWithoutDrain { backend: IpAddr },
    #[error("backend {backend} started_at: only a serving backend has one (a drained one starts when given a weight again)")]
    StartWithoutWeight { backend: IpAddr },
    #[error("health: {message}")]
    BadHealth { message: String },
    #[error("VIP {vip}: quic needs a UDP VIP")]
    QuicNotUdp { vip: Vip },
    #[error("VIP {vip} quic: {message}")]
    BadQuic { vip: Vip, message: String },
    #[error(
        "VIP {vip}: backends {other} and {backend} would both have QUIC server id {server_id} (the last server_id_len octets of \
         the address); a longer server_id_len tells them apart"
    )]
    QuicServerIdTaken { vip: Vip, backend: IpAddr, other: IpAddr, server_id: String },
    #[error("VIP {vip} source_prefix: only a VIP with hash \"source\" has one")]
    SourcePrefixWithoutSourceHash { vip: Vip },
    #[error("VIP {vip} source_prefix: {len} is out of range for an IPv{family} VIP (1..={max})")]
    SourcePrefixOutOfRange { vip: Vip, len: u8, max: u8, family: u8 },
}

impl FromStr for Vip {
    type Err = ModelError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = || ModelError::BadVip { input: input.to_owned() };
        let (sock, proto) = input.rsplit_once('/').ok_or_else(bad)?;
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => return Err(bad()),
        };
        let sock: SocketAddr = sock.parse().map_err(|_| bad())?;
        let addr = sock.ip();
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(bad());
        }
        Ok(Vip { addr, port: sock.port(), proto })
    }
}

impl fmt::Display for Vip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        write!(f, "{}/{proto}", SocketAddr::new(self.addr, self.port))
    }
}

impl Serialize for Vip {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Vip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    pub ring_size: u32,
    pub backends: BTreeMap<IpAddr, Backend>,
    /// This VIP's own new-flow limits; each part it leaves unset comes from
    /// `DesiredState::default_limits` (see [`DesiredState::effective_limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitConfig>,
    /// Health-check settings; `lbd`'s defaults when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<VipHealth>,
    /// The VIP is on an address of the balancer itself, on purpose (`lbctl vips add
    /// --force`): see `host::Host::check`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_local_address: bool,
    /// A QUIC VIP (UDP): short headers go by the server id in their connection id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicConfig>,
    /// A second QUIC-LB config id, live beside `quic` while a key is rotated (draft §3.1):
    /// the servers move to it, then `retire_quic` makes it the only one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic_next: Option<QuicConfig>,
    /// How its backends are tunnelled to, unless a backend's options say otherwise.
    #[serde(default, skip_serializing_if = "Encap::is_ipip")]
    pub encap: Encap,
    /// What Maglev hashes to place its new flows (client affinity).
    #[serde(default, skip_serializing_if = "HashMode::is_five_tuple")]
    pub hash: HashMode,
    /// With `HashMode::Source`: how many leading source address bits are hashed (the whole
    /// address when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_prefix: Option<u8>,
}

impl Default for VipConfig {
    fn default() -> Self {
        Self {
            ring_size: DEFAULT_RING_SIZE,
            backends: BTreeMap::new(),
            limits: None,
            health: None,
            allow_local_address: false,
            quic: None,
            quic_next: None,
            encap: Encap::Ipip,
            hash: HashMode::FiveTuple,
            source_prefix: None,
        }
    }
}

impl VipConfig {
    /// How `backend` is tunnelled to: its own setting, else the VIP's.
    pub fn encap_of(&self, backend: &Backend) -> Encap {
        backend.options.encap.unwrap_or(self.encap)
    }
}

/// Everything the balancer should be doing. Edits go through the checked methods, which
/// leave the state unchanged on error.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    pub vips: BTreeMap<Vip, VipConfig>,
    /// New-flow limits of every VIP without its own (per part: see `effective_limits`).
    /// Skipped when empty (also below), so a state without the feature reads as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limits: Option<LimitConfig>,
    /// Operator rules by client CIDR, globally or for one VIP.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<RuleMatch, RuleConfig>,
}

impl DesiredState {
    pub fn add_vip(&mut self, vip: Vip, ring_size: u32) -> Result<(), ModelError> {
        if self.vips.contains_key(&vip) {
            return Err(ModelError::DuplicateVip { vip });
        }
        if self.vips.len() >= Capacity::MAX.vips as usize {
            return Err(ModelError::TooManyVips);
        }
        if !valid_ring_size(ring_size) {
            return Err(ModelError::BadRingSize { size: ring_size });
        }
        self.vips.insert(vip, VipConfig { ring_size, ..VipConfig::default() });
        Ok(())
    }

    /// Removes a VIP with its backends, its limits and the rules scoped to it.
    pub fn remove_vip(&mut self, vip: &Vip) -> Result<VipConfig, ModelError> {
        let config = self.vips.remove(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        self.rules.retain(|rule, _| rule.vip != Some(*vip));
        Ok(config)
    }

    /// How the VIP's backends are tunnelled to (those without their own setting).
    pub fn set_encap(&mut self, vip: &Vip, encap: Encap) -> Result<(), ModelError> {
        self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.encap = encap;
        Ok(())
    }

    /// What Maglev hashes to place the VIP's new flows, and (source hash only) how many
    /// leading source address bits. Established flows keep their backends.
    pub fn set_hash(&mut self, vip: &Vip, hash: HashMode, source_prefix: Option<u8>) -> Result<(), ModelError> {
        affinity::check(vip, hash, source_prefix)?;
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        (config.hash, config.source_prefix) = (hash, source_prefix);
        Ok(())
    }

    /// Whether the VIP may be on an address of the balancer itself (see `host::Host::check`).
    pub fn allow_local_address(&mut self, vip: &Vip, allow: bool) -> Result<(), ModelError> {
        self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.allow_local_address = allow;
        Ok(())
    }

    pub fn vip(&self, vip: &Vip) -> Result<&VipConfig, ModelError> {
        self.vips.get(vip).ok_or(ModelError::UnknownVip { vip: *vip })
    }

    pub fn add_backend(&mut self, vip: &Vip, backend: IpAddr, weight: u32) -> Result<(), ModelError> {
        self.add_backend_with(vip, backend, Backend { weight, ..Backend::default() })
    }

    /// Adds a backend with all it may carry (options, a drain deadline).
    pub fn add_backend_with(&mut self, vip: &Vip, backend: IpAddr, config: Backend) -> Result<(), ModelError> {
        check_weight(config.weight)?;
        check_backend_address(vip, backend)?;
        config.options.validate(backend)?;
        if config.drain_deadline_unix_ms.is_some() && config.weight != 0 {
            return Err(ModelError::DeadlineWithoutDrain { backend });
        }
        if config.started_at_unix_ms.is_some() && config.weight == 0 {
            return Err(ModelError::StartWithoutWeight { backend });
        }
        let total: usize = self.vips.values().map(|v| v.backends.len()).sum();
        let vip_config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        if vip_config.backends.contains_key(&backend) {
            return Err(ModelError::DuplicateBackend { vip: *vip, backend });
        }
        if vip_config.backends.len() >= MAX_BACKENDS_PER_VIP as usize {
            return Err(ModelError::TooManyBackendsInVip { vip: *vip });
        }
        if total >= Capacity::MAX.backends as usize {
            return Err(ModelError::TooManyBackends);
        }
        vip_config.backends.insert(backend, config);
        if let Err(e) = quic::check_server_ids(vip, vip_config) {
            vip_config.backends.remove(&backend);
            return Err(e);
        }
        Ok(())
    }

    /// Makes a VIP a QUIC VIP with `quic` (or, with `None`, a plain one again).
    pub fn set_quic(&mut self, vip: &Vip, quic: Option<QuicConfig>) -> Result<(), ModelError> {
        if let Some(quic) = &quic {
            quic.check(vip)?;
        }
        let config = self.vips.get(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        if quic.is_none() && config.quic_next.is_some() {
            return Err(ModelError::BadQuic { vip: *vip, message: "quic_next needs quic: retire or drop it first".into() });
        }
        if let (Some(quic), Some(next)) = (&quic, &config.quic_next) {
            quic::check_next(vip, quic, next)?;
        }
        quic::check_server_ids(vip, &VipConfig { quic: quic.clone(), ..config.clone() })?;
        self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.quic = quic;
        Ok(())
    }

    /// Puts `next` beside the VIP's QUIC-LB configuration (or, with `None`, drops the one
    /// there): a second config id, with its own key, for a key rotation.
    pub fn set_quic_next(&mut self, vip: &Vip, next: Option<QuicConfig>) -> Result<(), ModelError> {
        let config = self.vips.get(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        if let Some(next) = &next {
            next.check(vip)?;
            let Some(quic) = &config.quic else {
                return Err(ModelError::BadQuic { vip: *vip, message: "quic_next needs quic: the VIP is not a QUIC VIP".into() });
            };
            quic::check_next(vip, quic, next)?;
        }
        self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.quic_next = next;
        Ok(())
    }

    /// Ends a key rotation: `quic_next` becomes the VIP's only QUIC-LB configuration, and the
    /// ids of the old config id go by the 5-tuple from now on.
    pub fn retire_quic(&mut self, vip: &Vip) -> Result<(), ModelError> {
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        let Some(next) = config.quic_next.take() else {
            return Err(ModelError::BadQuic { vip: *vip, message: "no quic_next to retire the current config id for".into() });
        };
        config.quic = Some(next);
        Ok(())
    }

    pub fn remove_backend(&mut self, vip: &Vip, backend: IpAddr) -> Result<(), ModelError> {
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        config.backends.remove(&backend).map(|_| ()).ok_or(ModelError::UnknownBackend { vip: *vip, backend })
    }

    pub fn set_weight(&mut self, vip: &Vip, backend: IpAddr, weight: u32) -> Result<(), ModelError> {
        check_weight(weight)?;
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        let entry = config.backends.get_mut(&backend).ok_or(ModelError::UnknownBackend { vip: *vip, backend })?;
        // Drained, it has no start; given a weight again, it gets a new one (`stamp_starts`).
        if weight == 0 {
            entry.started_at_unix_ms = None;
        }
        entry.weight = weight;
        entry.drain_deadline_unix_ms = None;
        Ok(())
    }

    /// Gives every backend that starts serving with this state (new, or given a weight again
    /// after a drain, relative to `before`) and has no declared start the start `now_unix_ms`;
    /// a backend serving in both keeps the start it had (applying a file without starts
    /// restarts nothing). Returns the starts given, for the caller to report.
    pub fn stamp_starts(&mut self, before: &DesiredState, now_unix_ms: u64) -> Vec<(Vip, IpAddr, u64)> {
        let mut stamped = Vec::new();
        for (vip, config) in &mut self.vips {
            for (addr, backend) in config.backends.iter_mut().filter(|(_, b)| b.weight > 0 && b.started_at_unix_ms.is_none()) {
                let serving_before = before.vips.get(vip).and_then(|c| c.backends.get(addr)).filter(|b| b.weight > 0);
                // A kept start is reported too: written into the file, it makes the file
                // whole, so the next balancer given it has nothing to add.
                let start = serving_before.map_or(Some(now_unix_ms), |old| old.started_at_unix_ms);
                backend.started_at_unix_ms = start;
                stamped.extend(start.map(|at| (*vip, *addr, at)));
            }
        }
        stamped
    }

    /// Drains a backend (weight 0); with a deadline (Unix ms) it is removed after it.
    pub fn drain_backend(&mut self, vip: &Vip, backend: IpAddr, deadline_unix_ms: Option<u64>) -> Result<(), ModelError> {
        self.set_weight(vip, backend, 0)?;
        if let Some(entry) = self.vips.get_mut(vip).and_then(|c| c.backends.get_mut(&backend)) {
            entry.drain_deadline_unix_ms = deadline_unix_ms;
        }
        Ok(())
    }

    /// Replaces a backend's options.
    pub fn set_backend_options(&mut self, vip: &Vip, backend: IpAddr, options: BackendOptions) -> Result<(), ModelError> {
        options.validate(backend)?;
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        let entry = config.backends.get_mut(&backend).ok_or(ModelError::UnknownBackend { vip: *vip, backend })?;
        entry.options = options;
        Ok(())
    }

    /// Sets (or with `None` clears) a VIP's health-check settings.
    pub fn set_health(&mut self, vip: &Vip, health: Option<VipHealth>) -> Result<(), ModelError> {
        if let Some(health) = &health {
            health.validate()?;
        }
        self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.health = health;
        Ok(())
    }

    /// The limits set for `vip`, or the default ones for `None` (not the effective ones).
    pub fn limits(&self, vip: Option<&Vip>) -> Result<Option<&LimitConfig>, ModelError> {
        match vip {
            None => Ok(self.default_limits.as_ref()),
            Some(vip) => Ok(self.vip(vip)?.limits.as_ref()),
        }
    }

    /// Sets (replaces) the limits of `vip`, or the default for every VIP with `None`.
    pub fn set_limits(&mut self, vip: Option<&Vip>, limits: LimitConfig) -> Result<(), ModelError> {
        limits.check(&scope_name(vip))?;
        *self.limits_slot(vip)? = Some(limits);
        Ok(())
    }

    /// Removes the limits of `vip` (or the default ones); nothing set is not an error.
    pub fn clear_limits(&mut self, vip: Option<&Vip>) -> Result<(), ModelError> {
        *self.limits_slot(vip)? = None;
        Ok(())
    }

    /// Sets the per-source part of a scope's limits, keeping its budget. Prefix lengths
    /// default to `DEFAULT_SOURCE_PREFIX_V4/V6`.
    pub fn set_per_source(
        &mut self,
        vip: Option<&Vip>,
        rate: RateSpec,
        source_prefix_v4: Option<u8>,
        source_prefix_v6: Option<u8>,
        observe: bool,
    ) -> Result<(), ModelError> {
        let mut limits = self.limits(vip)?.copied().unwrap_or_default();
        limits.per_source = Some(rate);
        limits.source_prefix_v4 = source_prefix_v4.unwrap_or(DEFAULT_SOURCE_PREFIX_V4);
        limits.source_prefix_v6 = source_prefix_v6.unwrap_or(DEFAULT_SOURCE_PREFIX_V6);
        limits.observe_source = observe;
        self.set_limits(vip, limits)
    }

    /// Sets the new-flow budget part of a scope's limits, keeping its per-source limit.
    pub fn set_budget(&mut self, vip: Option<&Vip>, rate: RateSpec, observe: bool) -> Result<(), ModelError> {
        let mut limits = self.limits(vip)?.copied().unwrap_or_default();
        limits.vip_budget = Some(rate);
        limits.observe_budget = observe;
        self.set_limits(vip, limits)
    }

    /// Removes one or both parts of a scope's limits (the whole entry once both are gone).
    pub fn clear_limit_parts(&mut self, vip: Option<&Vip>, per_source: bool, budget: bool) -> Result<(), ModelError> {
        let Some(mut limits) = self.limits(vip)?.copied() else { return Ok(()) };
        if per_source {
            let defaults = LimitConfig::default();
            limits.per_source = None;
            limits.source_prefix_v4 = defaults.source_prefix_v4;
            limits.source_prefix_v6 = defaults.source_prefix_v6;
            limits.observe_source = false;
        }
        if budget {
            limits.vip_budget = None;
            limits.observe_budget = false;
        }
        if limits.is_empty() { self.clear_limits(vip) } else { self.set_limits(vip, limits) }
    }

    /// The limits that apply to `vip`: each part (the per-source limit with its prefix
    /// lengths and observe flag; the budget with its observe flag) from the VIP's own limits
    /// when it sets that part, else from the default. `None`: no limit applies.
    pub fn effective_limits(&self, vip: &Vip) -> Option<LimitConfig> {
        let own = self.vips.get(vip).and_then(|c| c.limits.as_ref());
        LimitConfig::merged(own, self.default_limits.as_ref())
    }

    /// Adds a rule or changes the action of an existing one.
    pub fn set_rule(&mut self, rule: RuleMatch, config: RuleConfig) -> Result<(), ModelError> {
        rule.cidr.check()?;
        if let RuleAction::Limit(rate) = config.action {
            rate.check(&format!("rule {}: limit", rule.describe()))?;
        }
        if let Some(vip) = &rule.vip {
            self.vip(vip)?;
            if rule.cidr.addr.is_ipv4() != vip.addr.is_ipv4() {
                let family = |a: IpAddr| if a.is_ipv4() { 4 } else { 6 };
                return Err(ModelError::RuleFamilyMismatch {
                    cidr: rule.cidr,
                    vip: *vip,
                    cidr_family: family(rule.cidr.addr),
                    vip_family: family(vip.addr),
                });
            }
        }
        if !self.rules.contains_key(&rule) && self.rules.len() >= MAX_RULES as usize {
            return Err(ModelError::TooManyRules);
        }
        let same_scope = |r: &RuleMatch| r.vip == rule.vip && r.cidr.addr.is_ipv4() == rule.cidr.addr.is_ipv4();
        let lengths: BTreeSet<u8> = self.rules.keys().chain([&rule]).filter(|r| same_scope(r)).map(|r| r.cidr.prefix_len).collect();
        if lengths.len() > MAX_RULE_LENGTHS {
            let scope = rule.vip.map_or("global".to_owned(), |v| format!("VIP {v}'s"));
            return Err(ModelError::TooManyRuleLengths {
                rule: rule.describe(),
                scope,
                family: if rule.cidr.addr.is_ipv4() { 4 } else { 6 },
            });
        }
        self.rules.insert(rule, config);
        Ok(())
    }

    pub fn remove_rule(&mut self, rule: &RuleMatch) -> Result<(), ModelError> {
        self.rules.remove(rule).map(drop).ok_or_else(|| ModelError::UnknownRule { rule: rule.describe() })
    }

    /// Re-checks a whole state (e.g. one read from disk) against every rule the edits enforce.
    pub fn validate(&self) -> Result<(), ModelError> {
        let mut rebuilt = DesiredState::default();
        for (vip, config) in &self.vips {
            rebuilt.add_vip(*vip, config.ring_size)?;
            rebuilt.set_quic(vip, config.quic.clone())?;
            rebuilt.set_quic_next(vip, config.quic_next.clone())?;
            for (backend, b) in &config.backends {
                rebuilt.add_backend_with(vip, *backend, b.clone())?;
            }
            rebuilt.set_health(vip, config.health.clone())?;
            if let Some(limits) = config.limits {
                rebuilt.set_limits(Some(vip), limits)?;
            }
        }
        if let Some(limits) = self.default_limits {
            rebuilt.set_limits(None, limits)?;
        }
        for (rule, config) in &self.rules {
            rebuilt.set_rule(*rule, *config)?;
        }
        Ok(())
    }

    fn limits_slot(&mut self, vip: Option<&Vip>) -> Result<&mut Option<LimitConfig>, ModelError> {
        match vip {
            None => Ok(&mut self.default_limits),
            Some(vip) => Ok(&mut self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?.limits),
        }
    }
}

/// How errors and messages name a limits scope.
fn scope_name(vip: Option<&Vip>) -> String {
    match vip {
        None => "the default".to_owned(),
        Some(vip) => format!("VIP {vip}"),
    }
}

/// Highest rate a limit takes: at a billion new flows a second a limit no longer limits.
pub const MAX_RATE_PER_S: u32 = 1_000_000_000;

/// A new-flow rate: `per_s` sustained, plus `burst` admitted at once after a quiet period
/// (`burst` may be left out when read: one second's worth).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "RateFields")]
pub struct RateSpec {
    pub per_s: u32,
    pub burst: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateFields {
    per_s: u32,
    burst: Option<u32>,
}

impl From<RateFields> for RateSpec {
    fn from(fields: RateFields) -> Self {
        Self::new(fields.per_s, fields.burst)
    }
}

impl RateSpec {
    /// `burst` defaults to `per_s` (one second's worth). Unchecked: see [`RateSpec::check`].
    pub fn new(per_s: u32, burst: Option<u32>) -> Self {
        Self { per_s, burst: burst.unwrap_or(per_s) }
    }

    /// `per_s` must be 1..=`MAX_RATE_PER_S` (0 would read as "no limit" in the kernel).
    pub fn check(&self, field: &str) -> Result<(), ModelError> {
        if self.per_s == 0 || self.per_s > MAX_RATE_PER_S {
            return Err(ModelError::BadRate { field: field.to_owned(), per_s: self.per_s });
        }
        Ok(())
    }

    pub const fn to_rate(self) -> Rate {
        Rate::new(self.per_s, self.burst)
    }
}

impl fmt::Display for RateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s burst {}", self.per_s, self.burst)
    }
}

fn default_prefix_v4() -> u8 {
    DEFAULT_SOURCE_PREFIX_V4
}

fn default_prefix_v6() -> u8 {
    DEFAULT_SOURCE_PREFIX_V6
}

/// New-flow limits of one VIP, or the default of every VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// Per source prefix (`source_prefix_v4/v6` long): one bucket per prefix and VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_source: Option<RateSpec>,
    /// For the whole VIP: new flows above it are shed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip_budget: Option<RateSpec>,
    #[serde(default = "default_prefix_v4")]
    pub source_prefix_v4: u8,
    #[serde(default = "default_prefix_v6")]
    pub source_prefix_v6: u8,
    /// Count what the per-source limit would drop, drop nothing.
    #[serde(default)]
    pub observe_source: bool,
    /// Count what the budget would drop, drop nothing.
    #[serde(default)]
    pub observe_budget: bool,
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self {
            per_source: None,
            vip_budget: None,
            source_prefix_v4: DEFAULT_SOURCE_PREFIX_V4,
            source_prefix_v6: DEFAULT_SOURCE_PREFIX_V6,
            observe_source: false,
            observe_budget: false,
        }
    }
}

impl LimitConfig {
    /// True when it limits nothing.
    pub fn is_empty(&self) -> bool {
        self.per_source.is_none() && self.vip_budget.is_none()
    }

    /// Checks every field; errors name the scope and the field.
    pub fn check(&self, scope: &str) -> Result<(), ModelError> {
        if self.is_empty() {
            return Err(ModelError::EmptyLimits { scope: scope.to_owned() });
        }
        if let Some(rate) = &self.per_source {
            rate.check(&format!("{scope}: per_source"))?;
        }
        if let Some(rate) = &self.vip_budget {
            rate.check(&format!("{scope}: vip_budget"))?;
        }
        for (field, len, max) in [("source_prefix_v4", self.source_prefix_v4, 32), ("source_prefix_v6", self.source_prefix_v6, 128)] {
            if len == 0 || len > max {
                return Err(ModelError::BadPrefixLen { field: format!("{scope}: {field}"), len, max });
            }
        }
        Ok(())
    }

    /// Each part from `own` when it sets it, else from `default`; `None` when neither
    /// limits anything. Without a per-source limit the prefix lengths still come from the
    /// limits the data path reads (they key the source table's counters).
    pub fn merged(own: Option<&LimitConfig>, default: Option<&LimitConfig>) -> Option<LimitConfig> {
        let base = own.or(default).copied().unwrap_or_default();
        let mut out =
            LimitConfig { source_prefix_v4: base.source_prefix_v4, source_prefix_v6: base.source_prefix_v6, ..LimitConfig::default() };
        if let Some(from) = [own, default].into_iter().flatten().find(|c| c.per_source.is_some()) {
            out.per_source = from.per_source;
            out.source_prefix_v4 = from.source_prefix_v4;
            out.source_prefix_v6 = from.source_prefix_v6;
            out.observe_source = from.observe_source;
        }
        if let Some(from) = [own, default].into_iter().flatten().find(|c| c.vip_budget.is_some()) {
            out.vip_budget = from.vip_budget;
            out.observe_budget = from.observe_budget;
        }
        (!out.is_empty()).then_some(out)
    }

    /// The kernel's form, marked configured.
    pub fn to_limits(&self) -> Limits {
        let mut flags = 0;
        if self.observe_source {
            flags |= LIMIT_F_OBSERVE_SOURCE;
        }
        if self.observe_budget {
            flags |= LIMIT_F_OBSERVE_BUDGET;
        }
        Limits {
            per_source: self.per_source.map(RateSpec::to_rate).unwrap_or_default(),
            vip_budget: self.vip_budget.map(RateSpec::to_rate).unwrap_or_default(),
            flags,
            source_prefix_v4: self.source_prefix_v4,
            source_prefix_v6: self.source_prefix_v6,
            configured: 1,
            _pad: 0,
        }
    }
}

/// An address prefix: `10.0.0.0/8`, `2001:db8::/32`; host bits must be zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    /// Longest prefix of `addr`'s family.
    pub const fn max_len(addr: &IpAddr) -> u8 {
        match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// `addr` with every bit past `prefix_len` cleared (`prefix_len` at most `max_len`).
    pub fn mask(addr: IpAddr, prefix_len: u8) -> IpAddr {
        match addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix_len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix_len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }

    /// Whether the two prefixes share an address (one holds the other).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        let len = self.prefix_len.min(other.prefix_len);
        self.addr.is_ipv4() == other.addr.is_ipv4() && Self::mask(self.addr, len) == Self::mask(other.addr, len)
    }

    /// A checked prefix (length in range, no host bits).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<Self, ModelError> {
        let cidr = Self { addr, prefix_len };
        cidr.check()?;
        Ok(cidr)
    }

    pub fn check(&self) -> Result<(), ModelError> {
        let max = Self::max_len(&self.addr);
        if self.prefix_len > max {
            return Err(ModelError::CidrPrefixOutOfRange { input: format!("{}/{}", self.addr, self.prefix_len), max });
        }
        let canonical = Self::mask(self.addr, self.prefix_len);
        if canonical != self.addr {
            let canonical = Cidr { addr: canonical, prefix_len: self.prefix_len };
            return Err(ModelError::CidrHostBits { input: self.to_string(), canonical: canonical.to_string() });
        }
        Ok(())
    }

    pub const fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// `addr` is inside the prefix (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        addr.is_ipv4() == self.is_ipv4() && Self::mask(addr, self.prefix_len) == self.addr
    }
}

impl FromStr for Cidr {
    type Err = ModelError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = || ModelError::BadCidr { input: input.to_owned() };
        let (addr, len) = match input.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (input, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = Self::max_len(&addr);
        let prefix_len = match len {
            None => max,
            Some(len) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
                let len: u32 = len.parse().map_err(|_| ModelError::CidrPrefixOutOfRange { input: input.to_owned(), max })?;
                u8::try_from(len).ok().filter(|l| *l <= max).ok_or(ModelError::CidrPrefixOutOfRange { input: input.to_owned(), max })?
            }
            Some(_) => return Err(bad()),
        };
        Self::new(addr, prefix_len)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a rule matches: client addresses in `cidr`, for new flows to `vip` (or to every VIP).
/// Written `10.0.0.0/8` or `10.0.0.0/8@10.100.0.1:80/tcp` (the state file's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleMatch {
    pub cidr: Cidr,
    pub vip: Option<Vip>,
}

impl RuleMatch {
    /// For messages: `10.0.0.0/8 on every VIP`, `10.0.0.0/8 on VIP 10.0.0.1:80/tcp`.
    pub fn describe(&self) -> String {
        match &self.vip {
            None => format!("{} on every VIP", self.cidr),
            Some(vip) => format!("{} on VIP {vip}", self.cidr),
        }
    }
}

impl FromStr for RuleMatch {
    type Err = ModelError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let (cidr, vip) = match input.split_once('@') {
            Some((cidr, vip)) => (cidr, Some(vip.parse::<Vip>().map_err(|_| ModelError::BadRuleMatch { input: input.to_owned() })?)),
            None => (input, None),
        };
        Ok(Self { cidr: cidr.parse()?, vip })
    }
}

impl fmt::Display for RuleMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.vip {
            None => write!(f, "{}", self.cidr),
            Some(vip) => write!(f, "{}@{vip}", self.cidr),
        }
    }
}

impl Serialize for RuleMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RuleMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a rule does to the new flows it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// One bucket shared by everything the rule matches (a client class).
    Limit(RateSpec),
    Block,
    /// Spared the per-source limit (the VIP's budget still applies).
    Exempt,
}

impl RuleAction {
    /// Stable name (`lbctl rules list`, JSON).
    pub const fn label(&self) -> &'static str {
        match self {
            RuleAction::Limit(_) => "limit",
            RuleAction::Block => "block",
            RuleAction::Exempt => "exempt",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub action: RuleAction,
    /// Count what the rule would drop, drop nothing.
    #[serde(default)]
    pub observe: bool,
}

/// A rule's action without its rate, as the API and the configuration file name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleActionKind {
    Limit,
    Block,
    Exempt,
}

impl RuleActionKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::Limit => "limit",
            Self::Block => "block",
            Self::Exempt => "exempt",
        }
    }
}

impl RuleConfig {
    /// A rule's configuration from flat fields (the API's and the file's): `per_s` (and
    /// `burst`, default `per_s`) only with a limit. The rate itself is checked by `set_rule`.
    pub fn from_parts(
        rule: &RuleMatch,
        action: RuleActionKind,
        per_s: Option<u32>,
        burst: Option<u32>,
        observe: bool,
    ) -> Result<Self, ModelError> {
        let bad = |problem| ModelError::BadRule { rule: rule.describe(), problem };
        let action = match (action, per_s) {
            (RuleActionKind::Limit, Some(per_s)) => RuleAction::Limit(RateSpec::new(per_s, burst)),
            (RuleActionKind::Limit, None) => return Err(bad("a limit needs a rate (per_s)")),
            (_, Some(_)) => return Err(bad("only a limit takes a rate")),
            (RuleActionKind::Block, None) => RuleAction::Block,
            (RuleActionKind::Exempt, None) => RuleAction::Exempt,
        };
        if burst.is_some() && !matches!(action, RuleAction::Limit(_)) {
            return Err(bad("only a limit takes a burst"));
        }
        Ok(Self { action, observe })
    }

    /// The flat fields back: action, rate (limits only).
    pub fn parts(&self) -> (RuleActionKind, Option<RateSpec>) {
        match self.action {
            RuleAction::Limit(rate) => (RuleActionKind::Limit, Some(rate)),
            RuleAction::Block => (RuleActionKind::Block, None),
            RuleAction::Exempt => (RuleActionKind::Exempt, None),
        }
    }
}

/// The weight of a backend that serves (not draining): 1..=`MAX_WEIGHT`.
pub fn check_serving_weight(weight: u32) -> Result<u32, ModelError> {
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(ModelError::ServingWeightOutOfRange { weight });
    }
    Ok(weight)
}

fn check_weight(weight: u32) -> Result<(), ModelError> {
    if weight > MAX_WEIGHT {
        return Err(ModelError::WeightOutOfRange { weight });
    }
    Ok(())
}

fn check_backend_address(vip: &Vip, backend: IpAddr) -> Result<(), ModelError> {
    let unusable = backend.is_unspecified() || backend.is_multicast() || matches!(backend, IpAddr::V4(v4) if v4.is_broadcast());
    if unusable {
        return Err(ModelError::BadBackendAddress { backend });
    }
    if vip.addr.is_ipv6() && backend.is_ipv4() {
        return Err(ModelError::FamilyMismatch { backend });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ip, vip};

    #[test]
    fn a_backend_that_starts_serving_gets_a_start_and_one_that_serves_keeps_its_own() {
        let v = vip("10.0.0.1:80/tcp");
        let mut before = DesiredState::default();
        before.add_vip(v, 13).unwrap();
        before.add_backend(&v, ip("10.0.1.1"), 100).unwrap(); // from before the field: no start
        before.add_backend_with(&v, ip("10.0.1.2"), Backend { weight: 100, started_at_unix_ms: Some(5), ..Backend::default() }).unwrap();
        before.add_backend(&v, ip("10.0.1.3"), 100).unwrap();
        before.drain_backend(&v, ip("10.0.1.3"), None).unwrap();
        // A file that declares no starts: .1 and .2 keep theirs (none, 5), the undrained .3 and
        // the new .4 start now. The kept start is reported too, so the file gets it written.
        let mut next = before.clone();
        next.vips.get_mut(&v).unwrap().backends.values_mut().for_each(|b| b.started_at_unix_ms = None);
        next.set_weight(&v, ip("10.0.1.3"), 100).unwrap();
        next.add_backend(&v, ip("10.0.1.4"), 100).unwrap();
        let stamped = next.stamp_starts(&before, 1000);
        assert_eq!(stamped, [(v, ip("10.0.1.2"), 5), (v, ip("10.0.1.3"), 1000), (v, ip("10.0.1.4"), 1000)]);
        let starts: Vec<Option<u64>> = next.vips[&v].backends.values().map(|b| b.started_at_unix_ms).collect();
        assert_eq!(starts, [None, Some(5), Some(1000), Some(1000)]);
        // Draining forgets it; a drained backend with one is refused.
        next.drain_backend(&v, ip("10.0.1.4"), None).unwrap();
        assert_eq!(next.vips[&v].backends[&ip("10.0.1.4")].started_at_unix_ms, None);
        let drained = Backend { weight: 0, started_at_unix_ms: Some(5), ..Backend::default() };
        assert!(matches!(next.add_backend_with(&v, ip("10.0.1.5"), drained), Err(ModelError::StartWithoutWeight { .. })));
    }

    #[test]
    fn vip_syntax() {
        for (input, shown) in
            [("10.0.0.1:80/tcp", "10.0.0.1:80/tcp"), ("10.0.0.1:0/UDP", "10.0.0.1:0/udp"), ("[fd00::1]:443/tcp", "[fd00::1]:443/tcp")]
        {
            assert_eq!(vip(input).to_string(), shown);
        }
        for bad in [
            "10.0.0.1:80",
            "10.0.0.1/tcp",
            "10.0.0.1:80/sctp",
            "fd00::1:80/tcp",
            "0.0.0.0:80/tcp",
            "10.0.0.1:99999/tcp",
            "224.0.0.1:80/udp",
        ] {
            assert!(matches!(bad.parse::<Vip>(), Err(ModelError::BadVip { .. })), "{bad} accepted");
        }
    }

    #[test]
    fn edits_refuse_bad_input_and_change_nothing() {
        let mut state = DesiredState::default();
        let v = vip("10.0.0.1:80/tcp");
        state.add_vip(v, DEFAULT_RING_SIZE).unwrap();
        state.add_backend(&v, "10.0.0.101".parse().unwrap(), 100).unwrap();
        let before = state.clone();
        let cases: Vec<(Result<(), ModelError>, ModelError)> = vec![
            (state.add_vip(v, DEFAULT_RING_SIZE), ModelError::DuplicateVip { vip: v }),
            (state.add_vip(vip("10.0.0.2:80/tcp"), 100), ModelError::BadRingSize { size: 100 }),
            (
                state.add_backend(&v, "10.0.0.101".parse().unwrap(), 1),
                ModelError::DuplicateBackend { vip: v, backend: "10.0.0.101".parse().unwrap() },
            ),
            (state.add_backend(&v, "10.0.0.102".parse().unwrap(), MAX_WEIGHT + 1), ModelError::WeightOutOfRange { weight: MAX_WEIGHT + 1 }),
            (
                state.add_backend(&vip("10.9.9.9:80/tcp"), "10.0.0.102".parse().unwrap(), 1),
                ModelError::UnknownVip { vip: vip("10.9.9.9:80/tcp") },
            ),
            (
                state.remove_backend(&v, "10.0.0.199".parse().unwrap()),
                ModelError::UnknownBackend { vip: v, backend: "10.0.0.199".parse().unwrap() },
            ),
            (state.add_backend(&v, "0.0.0.0".parse().unwrap(), 1), ModelError::BadBackendAddress { backend: "0.0.0.0".parse().unwrap() }),
        ];
        for (got, want) in cases {
            assert_eq!(got, Err(want));
        }
        assert_eq!(state, before);
    }

    #[test]
    fn v6_vip_refuses_v4_backend_but_v4_vip_takes_v6() {
        let mut state = DesiredState::default();
        let v6 = vip("[fd00:100::1]:80/tcp");
        let v4 = vip("10.100.0.1:80/tcp");
        state.add_vip(v6, 251).unwrap();
        state.add_vip(v4, 251).unwrap();
        assert!(matches!(state.add_backend(&v6, "10.0.0.1".parse().unwrap(), 1), Err(ModelError::FamilyMismatch { .. })));
        state.add_backend(&v4, "fd00::101".parse().unwrap(), 1).unwrap();
    }

    #[test]
    fn probe_paths_are_kept_per_vip_and_backend_and_left_out_when_default() {
        use super::ProbePath;
        let mut state = DesiredState::default();
        let v = vip("10.0.0.1:80/tcp");
        state.add_vip(v, 13).unwrap();
        let b: IpAddr = "10.0.1.1".parse().unwrap();
        state.add_backend(&v, b, 100).unwrap();
        state.set_health(&v, Some(VipHealth::default())).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        assert!(!json.contains("probe_path"), "through the tunnel is the default: {json}");
        state.set_health(&v, Some(VipHealth { probe_path: ProbePath::Direct, ..VipHealth::default() })).unwrap();
        let options = BackendOptions { probe_path: Some(ProbePath::Tunnel), ..BackendOptions::default() };
        state.set_backend_options(&v, b, options).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        assert!(json.contains(r#""probe_path":"direct""#) && json.contains(r#""probe_path":"tunnel""#), "{json}");
        let back: DesiredState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        back.validate().unwrap();
        let bad = json.replace(r#""probe_path":"direct""#, r#""probe_path":"sideways""#);
        let err = serde_json::from_str::<DesiredState>(&bad).unwrap_err().to_string();
        assert!(err.contains("sideways") && err.contains("direct") && err.contains("tunnel"), "{err}");
    }

    #[test]
    fn state_round_trips_through_json_and_validates() {
        let mut state = DesiredState::default();
        let v = vip("[fd00::1]:0/udp");
        state.add_vip(v, 4099).unwrap();
        state.add_backend(&v, "fd00::101".parse().unwrap(), 0).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        let back: DesiredState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        back.validate().unwrap();
        let mut broken = state;
        broken.vips.get_mut(&v).unwrap().ring_size = 10;
        assert_eq!(broken.validate(), Err(ModelError::BadRingSize { size: 10 }));
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn rule(s: &str) -> RuleMatch {
        s.parse().unwrap()
    }

    fn per_source(per_s: u32) -> LimitConfig {
        LimitConfig { per_source: Some(RateSpec::new(per_s, None)), ..LimitConfig::default() }
    }

    fn block() -> RuleConfig {
        RuleConfig { action: RuleAction::Block, observe: false }
    }

    #[test]
    fn cidr_syntax() {
        for (input, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3", "10.1.2.3/32"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("2001:db8::1", "2001:db8::1/128"),
            ("::/0", "::/0"),
            ("192.168.1.128/25", "192.168.1.128/25"),
        ] {
            assert_eq!(cidr(input).to_string(), shown);
            assert_eq!(cidr(shown), cidr(input));
        }
        assert_eq!(
            "10.0.0.1/8".parse::<Cidr>(),
            Err(ModelError::CidrHostBits { input: "10.0.0.1/8".into(), canonical: "10.0.0.0/8".into() })
        );
        let err = "2001:db8::1/32".parse::<Cidr>().unwrap_err();
        assert_eq!(err.to_string(), "CIDR 2001:db8::1/32 has host bits set; did you mean 2001:db8::/32?");
        assert!(matches!("10.0.0.0/33".parse::<Cidr>(), Err(ModelError::CidrPrefixOutOfRange { max: 32, .. })));
        assert!(matches!("2001:db8::/129".parse::<Cidr>(), Err(ModelError::CidrPrefixOutOfRange { max: 128, .. })));
        assert!(matches!("10.0.0.0/4294967296".parse::<Cidr>(), Err(ModelError::CidrPrefixOutOfRange { .. })));
        for bad in [
            "",
            "10.0.0/8",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            "10.0.0.0/abc",
            "[::1]/128",
            "host/8",
            "10.0.0.0/8/8",
        ] {
            assert!(matches!(bad.parse::<Cidr>(), Err(ModelError::BadCidr { .. })), "{bad:?} accepted");
        }
        assert!(Cidr { addr: "10.0.0.1".parse().unwrap(), prefix_len: 24 }.check().is_err());
    }

    #[test]
    fn rule_match_syntax() {
        for input in ["10.0.0.0/8", "10.0.0.0/8@10.100.0.1:80/tcp", "2001:db8::/32@[fd00::1]:443/tcp"] {
            assert_eq!(rule(input).to_string(), input);
        }
        assert_eq!(rule("10.1.2.3@10.100.0.1:0/udp"), RuleMatch { cidr: cidr("10.1.2.3/32"), vip: Some(vip("10.100.0.1:0/udp")) });
        assert!(matches!("10.0.0.0/8@10.100.0.1".parse::<RuleMatch>(), Err(ModelError::BadRuleMatch { .. })));
        assert!(matches!("10.0.0.1/8@10.100.0.1:80/tcp".parse::<RuleMatch>(), Err(ModelError::CidrHostBits { .. })));
        // Global rules sort before scoped ones of the same CIDR.
        assert!(rule("10.0.0.0/8") < rule("10.0.0.0/8@10.100.0.1:80/tcp"));
    }

    #[test]
    fn limits_edits_check_every_field_and_change_nothing_on_error() {
        let mut state = DesiredState::default();
        let v = vip("10.0.0.1:80/tcp");
        state.add_vip(v, 13).unwrap();
        state.set_limits(None, per_source(100)).unwrap();
        let before = state.clone();
        let unknown = vip("10.9.9.9:80/tcp");
        let cases: Vec<(LimitConfig, Option<&Vip>, &str)> = vec![
            (per_source(0), Some(&v), "VIP 10.0.0.1:80/tcp: per_source: 0 new flows per second is out of range (1..=1000000000)"),
            (per_source(MAX_RATE_PER_S + 1), None, "the default: per_source: 1000000001 new flows"),
            (
                LimitConfig { vip_budget: Some(RateSpec::new(0, Some(5))), ..LimitConfig::default() },
                Some(&v),
                "VIP 10.0.0.1:80/tcp: vip_budget: 0 new flows",
            ),
            (LimitConfig { source_prefix_v4: 0, ..per_source(1) }, Some(&v), "source_prefix_v4: prefix length 0 is out of range (1..=32)"),
            (LimitConfig { source_prefix_v4: 33, ..per_source(1) }, None, "the default: source_prefix_v4: prefix length 33"),
            (
                LimitConfig { source_prefix_v6: 129, ..per_source(1) },
                Some(&v),
                "source_prefix_v6: prefix length 129 is out of range (1..=128)",
            ),
            (LimitConfig::default(), Some(&v), "nothing to set"),
            (per_source(1), Some(&unknown), "unknown VIP 10.9.9.9:80/tcp"),
        ];
        for (limits, scope, message) in cases {
            let err = state.set_limits(scope, limits).unwrap_err();
            assert!(err.to_string().contains(message), "{limits:?}: {err} lacks {message:?}");
        }
        assert!(matches!(state.clear_limits(Some(&unknown)), Err(ModelError::UnknownVip { .. })));
        assert!(matches!(state.set_budget(Some(&unknown), RateSpec::new(1, None), false), Err(ModelError::UnknownVip { .. })));
        assert!(matches!(
            state.set_per_source(Some(&v), RateSpec::new(5, None), Some(0), None, false),
            Err(ModelError::BadPrefixLen { .. })
        ));
        assert_eq!(state, before);
    }

    #[test]
    fn limit_parts_are_set_and_cleared_independently() {
        let mut state = DesiredState::default();
        let v = vip("10.0.0.1:80/tcp");
        state.add_vip(v, 13).unwrap();
        state.set_per_source(Some(&v), RateSpec::new(50, Some(500)), Some(24), None, true).unwrap();
        state.set_budget(Some(&v), RateSpec::new(1000, None), false).unwrap();
        let limits = *state.limits(Some(&v)).unwrap().unwrap();
        assert_eq!(
            limits,
            LimitConfig {
                per_source: Some(RateSpec { per_s: 50, burst: 500 }),
                vip_budget: Some(RateSpec { per_s: 1000, burst: 1000 }),
                source_prefix_v4: 24,
                source_prefix_v6: 64,
                observe_source: true,
                observe_budget: false,
            }
        );
        // Replacing the per-source limit replaces its prefixes and mode, and keeps the budget.
        state.set_per_source(Some(&v), RateSpec::new(60, None), None, Some(48), false).unwrap();
        let limits = *state.limits(Some(&v)).unwrap().unwrap();
        assert_eq!((limits.per_source, limits.source_prefix_v4, limits.source_prefix_v6), (Some(RateSpec::new(60, Some(60))), 32, 48));
        assert!(!limits.observe_source && limits.vip_budget.is_some());
        state.clear_limit_parts(Some(&v), false, true).unwrap();
        assert_eq!(state.limits(Some(&v)).unwrap().unwrap().vip_budget, None);
        state.clear_limit_parts(Some(&v), true, false).unwrap();
        assert_eq!(state.limits(Some(&v)).unwrap(), None, "an entry without parts is removed");
        // Clearing what is not set changes nothing.
        let before = state.clone();
        state.clear_limit_parts(None, true, true).unwrap();
        state.clear_limits(Some(&v)).unwrap();
        assert_eq!(state, before);
    }

    #[test]
    fn effective_limits_take_each_part_from_the_vip_else_the_default() {
        let mut state = DesiredState::default();
        let (a, b) = (vip("10.0.0.1:80/tcp"), vip("10.0.0.2:80/tcp"));
        state.add_vip(a, 13).unwrap();
        state.add_vip(b, 13).unwrap();
        assert_eq!(state.effective_limits(&a), None);
        state.set_per_source(None, RateSpec::new(100, None), Some(24), None, true).unwrap();
        state.set_budget(Some(&a), RateSpec::new(5000, None), false).unwrap();
        let effective = state.effective_limits(&a).unwrap();
        assert_eq!(effective.per_source, Some(RateSpec::new(100, None)));
        assert_eq!((effective.source_prefix_v4, effective.observe_source), (24, true));
        assert_eq!(effective.vip_budget, Some(RateSpec::new(5000, None)));
        assert_eq!(state.effective_limits(&b), state.default_limits);
        // The VIP's own per-source limit wins, prefix lengths and mode included.
        state.set_per_source(Some(&a), RateSpec::new(7, None), None, None, false).unwrap();
        let effective = state.effective_limits(&a).unwrap();
        assert_eq!((effective.per_source, effective.source_prefix_v4, effective.observe_source), (Some(RateSpec::new(7, None)), 32, false));
        // Without any per-source limit, the prefix lengths (which key the source table) are
        // those of the limits the data path reads.
        let budget_only = LimitConfig { vip_budget: Some(RateSpec::new(9, None)), source_prefix_v4: 16, ..LimitConfig::default() };
        let merged = LimitConfig::merged(Some(&budget_only), Some(&LimitConfig { source_prefix_v4: 24, ..budget_only })).unwrap();
        assert_eq!((merged.per_source, merged.source_prefix_v4), (None, 16));
        assert_eq!(LimitConfig::merged(None, Some(&LimitConfig { source_prefix_v4: 24, ..budget_only })).unwrap().source_prefix_v4, 24);
    }

    #[test]
    fn kernel_form_of_limits() {
        let limits = LimitConfig {
            per_source: Some(RateSpec::new(10, Some(20))),
            vip_budget: None,
            source_prefix_v4: 24,
            source_prefix_v6: 56,
            observe_source: false,
            observe_budget: true,
        };
        assert_eq!(
            limits.to_limits(),
            Limits {
                per_source: Rate::new(10, 20),
                vip_budget: Rate::new(0, 0),
                flags: LIMIT_F_OBSERVE_BUDGET,
                source_prefix_v4: 24,
                source_prefix_v6: 56,
                configured: 1,
                _pad: 0,
            }
        );
    }

    #[test]
    fn rule_edits_are_checked() {
        let mut state = DesiredState::default();
        let (v4, v6) = (vip("10.0.0.1:80/tcp"), vip("[fd00::1]:443/tcp"));
        state.add_vip(v4, 13).unwrap();
        state.add_vip(v6, 13).unwrap();
        state.set_rule(rule("10.0.0.0/8"), block()).unwrap();
        let before = state.clone();
        let limit0 = RuleConfig { action: RuleAction::Limit(RateSpec::new(0, None)), observe: false };
        let cases: Vec<(Result<(), ModelError>, &str)> = vec![
            (
                state.set_rule(rule("2001:db8::/32@10.0.0.1:80/tcp"), block()),
                "an IPv6 CIDR never matches clients of the IPv4 VIP 10.0.0.1:80/tcp",
            ),
            (state.set_rule(rule("10.0.0.0/8@[fd00::1]:443/tcp"), block()), "an IPv4 CIDR never matches clients of the IPv6 VIP"),
            (state.set_rule(rule("10.0.0.0/8@10.9.9.9:80/tcp"), block()), "unknown VIP 10.9.9.9:80/tcp"),
            (state.set_rule(rule("10.1.0.0/16"), limit0), "rule 10.1.0.0/16 on every VIP: limit: 0 new flows per second"),
            (
                state.set_rule(RuleMatch { cidr: Cidr { addr: "10.1.0.1".parse().unwrap(), prefix_len: 16 }, vip: None }, block()),
                "has host bits set; did you mean 10.1.0.0/16?",
            ),
            (state.remove_rule(&rule("10.0.0.0/8@10.0.0.1:80/tcp")), "no rule for 10.0.0.0/8 on VIP 10.0.0.1:80/tcp"),
        ];
        for (got, message) in cases {
            let err = got.unwrap_err();
            assert!(err.to_string().contains(message), "{err} lacks {message:?}");
        }
        assert_eq!(state, before);
        // Changing a rule replaces its action.
        let exempt = RuleConfig { action: RuleAction::Exempt, observe: true };
        state.set_rule(rule("10.0.0.0/8"), exempt).unwrap();
        assert_eq!(state.rules[&rule("10.0.0.0/8")], exempt);
        state.remove_rule(&rule("10.0.0.0/8")).unwrap();
        assert!(state.rules.is_empty());
    }

    #[test]
    fn rules_are_bounded_but_changing_one_is_not_adding() {
        let mut state = DesiredState::default();
        for i in 0..MAX_RULES {
            state
                .set_rule(RuleMatch { cidr: Cidr::new(IpAddr::from([10, 0, (i >> 8) as u8, i as u8]), 32).unwrap(), vip: None }, block())
                .unwrap();
        }
        assert_eq!(state.set_rule(rule("192.0.2.0/24"), block()), Err(ModelError::TooManyRules));
        state.set_rule(rule("10.0.0.0/32"), RuleConfig { action: RuleAction::Exempt, observe: false }).unwrap();
        state.validate().unwrap();
    }

    #[test]
    fn a_scope_uses_a_bounded_number_of_prefix_lengths_per_family() {
        let mut state = DesiredState::default();
        for len in 17..=24 {
            state.set_rule(rule(&format!("10.0.0.0/{len}")), block()).unwrap();
        }
        // Another length in the same scope and family is refused, naming the rule...
        let err = state.set_rule(rule("10.0.0.0/25"), block()).unwrap_err();
        assert!(matches!(err, ModelError::TooManyRuleLengths { .. }) && err.to_string().contains("10.0.0.0/25"), "{err}");
        // ...a length already in use, another family or another scope is not.
        state.set_rule(rule("10.9.0.0/24"), block()).unwrap();
        state.set_rule(rule("2001:db8::/40"), block()).unwrap();
        state.add_vip(vip("10.0.0.1:80/tcp"), 13).unwrap();
        state.set_rule(rule("10.0.0.0/25@10.0.0.1:80/tcp"), block()).unwrap();
        state.validate().unwrap();
    }

    #[test]
    fn removing_a_vip_removes_its_rules_and_limits() {
        let mut state = DesiredState::default();
        let (a, b) = (vip("10.0.0.1:80/tcp"), vip("10.0.0.2:80/tcp"));
        state.add_vip(a, 13).unwrap();
        state.add_vip(b, 13).unwrap();
        state.set_limits(Some(&a), per_source(5)).unwrap();
        for r in ["10.0.0.0/8@10.0.0.1:80/tcp", "10.0.0.0/8@10.0.0.2:80/tcp", "10.0.0.0/8", "192.0.2.0/24@10.0.0.1:80/tcp"] {
            state.set_rule(rule(r), block()).unwrap();
        }
        state.remove_vip(&a).unwrap();
        let left: Vec<String> = state.rules.keys().map(ToString::to_string).collect();
        assert_eq!(left, ["10.0.0.0/8", "10.0.0.0/8@10.0.0.2:80/tcp"]);
        state.add_vip(a, 13).unwrap();
        assert_eq!(state.limits(Some(&a)).unwrap(), None);
    }

    #[test]
    fn limits_and_rules_round_trip_through_json() {
        let mut state = DesiredState::default();
        let v = vip("[fd00::1]:443/tcp");
        state.add_vip(v, 13).unwrap();
        state.set_per_source(None, RateSpec::new(100, Some(200)), Some(24), Some(48), true).unwrap();
        state.set_budget(Some(&v), RateSpec::new(1000, None), false).unwrap();
        state
            .set_rule(
                rule("2001:db8::/32@[fd00::1]:443/tcp"),
                RuleConfig { action: RuleAction::Limit(RateSpec::new(5, Some(0))), observe: true },
            )
            .unwrap();
        state.set_rule(rule("192.0.2.7"), block()).unwrap();
        state.set_rule(rule("198.51.100.0/24"), RuleConfig { action: RuleAction::Exempt, observe: false }).unwrap();
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "vips": {"[fd00::1]:443/tcp": {"ring_size": 13, "backends": {},
                         "limits": {"vip_budget": {"per_s": 1000, "burst": 1000}, "source_prefix_v4": 32, "source_prefix_v6": 64,
                                    "observe_source": false, "observe_budget": false}}},
                "default_limits": {"per_source": {"per_s": 100, "burst": 200}, "source_prefix_v4": 24, "source_prefix_v6": 48,
                                   "observe_source": true, "observe_budget": false},
                "rules": {
                    "192.0.2.7/32": {"action": "block", "observe": false},
                    "198.51.100.0/24": {"action": "exempt", "observe": false},
                    "2001:db8::/32@[fd00::1]:443/tcp": {"action": {"limit": {"per_s": 5, "burst": 0}}, "observe": true},
                },
            })
        );
        let back: DesiredState = serde_json::from_value(json).unwrap();
        assert_eq!(back, state);
        back.validate().unwrap();
    }

    #[test]
    fn a_state_file_from_before_limits_loads_and_one_without_them_reads_the_same() {
        let old = r#"{"vips": {"10.0.0.1:80/tcp": {"ring_size": 13, "backends": {"10.0.1.1": {"weight": 100}}}}}"#;
        let state: DesiredState = serde_json::from_str(old).unwrap();
        state.validate().unwrap();
        assert_eq!((state.default_limits, state.rules.len(), state.vips[&vip("10.0.0.1:80/tcp")].limits), (None, 0, None));
        // Unused, the new fields stay out of the file: an older lbd can still read it.
        assert_eq!(serde_json::to_value(&state).unwrap(), serde_json::from_str::<serde_json::Value>(old).unwrap());
        // Omitted limit fields take their defaults.
        let sparse: LimitConfig = serde_json::from_str(r#"{"per_source": {"per_s": 3, "burst": 3}}"#).unwrap();
        assert_eq!(sparse, per_source(3));
    }

    #[test]
    fn validate_rechecks_limits_and_rules_from_a_file() {
        let base = r#""vips": {"10.0.0.1:80/tcp": {"ring_size": 13, "backends": {}}}"#;
        for (extra, message) in [
            (r#""default_limits": {"per_source": {"per_s": 0, "burst": 1}}"#, "per_source: 0 new flows"),
            (r#""default_limits": {"per_source": {"per_s": 1, "burst": 1}, "source_prefix_v6": 0}"#, "source_prefix_v6"),
            (r#""default_limits": {}"#, "nothing to set"),
            (r#""rules": {"10.0.0.0/8@10.0.0.2:80/tcp": {"action": "block"}}"#, "unknown VIP 10.0.0.2:80/tcp"),
            (r#""rules": {"2001:db8::/32@10.0.0.1:80/tcp": {"action": "block"}}"#, "IPv6 CIDR"),
            (r#""rules": {"10.0.0.0/8": {"action": {"limit": {"per_s": 0, "burst": 0}}}}"#, "limit: 0 new flows"),
        ] {
            let state: DesiredState = serde_json::from_str(&format!("{{{base}, {extra}}}")).unwrap();
            let err = state.validate().unwrap_err();
            assert!(err.to_string().contains(message), "{extra}: {err} lacks {message:?}");
        }
        for unparsable in [
            r#""rules": {"10.0.0.1/8": {"action": "block"}}"#,
            r#""rules": {"10.0.0.0/8": {"action": "drop"}}"#,
            r#""default_limits": {"per_source": {"per_s": -1, "burst": 1}}"#,
            r#""default_limits": {"per_sauce": {"per_s": 1, "burst": 1}}"#,
        ] {
            assert!(serde_json::from_str::<DesiredState>(&format!("{{{base}, {unparsable}}}")).is_err(), "{unparsable} parsed");
        }
    }
}
