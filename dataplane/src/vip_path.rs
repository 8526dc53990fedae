//! The probe path on the balancer: what makes a probe to a VIP leave encapsulated to one
//! backend, as that VIP's traffic does (see `xdp-ebpf/src/bin/lb/probe.rs`).
//!
//! ```text
//!  probe socket (mark: tag | generation | backend id), to VIP:port, from the iface address
//!    │  ip rule: fwmark <tag>/0xff000000 → table <probe-table>: default dev <probe-device>
//!    ▼
//!  <probe-device> (ifb: drops whatever is not redirected; no ARP; no addresses)
//!    │  tc egress: spillway_probe — backend from the mark, encapsulate, FIB, redirect
//!    ▼
//!  the data path's egress → backend (decapsulates, answers from the VIP straight back)
//! ```
//!
//! `lbd` creates the device, the rule (IPv4 and IPv6) and the table's default routes, and
//! attaches the program through a pinned link that the next `lbd` takes over; `lbd --cleanup`
//! removes them all. Each `lbd` on a host (each pin directory) has names of its own
//! ([`ProbeNames`]), so one's cleanup never removes another's path. A running `lbd` restores
//! a path found broken ([`VipPath::repair`]). [`VipPath::local_problem`] tells the balancer's
//! own trouble (program detached, rule gone, replies dropped by its reverse-path filter) from
//! the backend's, so a probe failing for the balancer's reasons is `Unknown`, never a backend
//! failure; and a probe sent while the path was not whole is `Unknown` too, whatever it
//! answered ([`VipPath::broken_for`]): it may have gone any other way.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
};

use aya::programs::{ProgramError, SchedClassifier};
use clap::Args;
use spillway_common::types::{PROBE_MARK_TAG_MASK, PROBE_MARK_TAG_SHIFT, ProbeConfig, ProbeReason, probe_mark};

use crate::{Balancer, DataplaneError, ProbeMaps};
use crate::{
    netif::{self, NetifError},
    pins::{self, Attachment, DEFAULT_PIN_DIR, PinError, PinLayout},
    rtnl::{Family, Link, Lookup, MarkRule, RTN_LOCAL, Rtnl, RtnlError},
};
use spillway_logging::event;

/// Priority of the mark rules: ahead of the main table and of the usual policy rules (a
/// VRF's is 1000); they match nothing but probe marks.
pub const RULE_PRIORITY: u32 = 100;
/// Longest interface name (IFNAMSIZ - 1).
const MAX_DEVICE_NAME: usize = 15;
/// The names of the default pin directory's probe path (kept: existing installs have them).
pub const DEFAULT_PROBE_DEVICE: &str = "spw-probe";
pub const DEFAULT_PROBE_TABLE: u32 = 5357;
pub const DEFAULT_PROBE_MARK: u8 = 0x53;
/// Tables derived for other pin directories: 0x53000000-0x53ffffff, far from the kernel's
/// own (0, 253-255) and from the small numbers operators pick.
const DERIVED_TABLE_BASE: u32 = 0x5300_0000;
const DERIVED_TABLE_SPAN: u64 = 1 << 24;
/// Where a probe path's routing is checked: documentation addresses, routed like any VIP by
/// the mark rule's table (a default route).
const CHECK_DST_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const CHECK_DST_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));

/// `lbd`'s options for the probe path. Unset, each is derived from the pin directory
/// ([`ProbeNames::for_pin_dir`]).
#[derive(Clone, Debug, Args)]
pub struct VipPathArgs {
    /// Device lbd creates for probes through the tunnel: an ifb, which drops anything the
    /// probe program does not send on [default: spw-probe with the default --pin-dir; with
    /// another, spw-p-<8 hex digits> derived from it, so that each lbd on a host has its own].
    #[arg(long, value_name = "NAME", value_parser = parse_device)]
    pub probe_device: Option<String>,
    /// Routing table for the probe sockets (chosen by their mark) [default: 5357 with the
    /// default --pin-dir; with another, one derived from it in 0x53000000-0x53ffffff].
    #[arg(long, value_name = "N", value_parser = parse_table)]
    pub probe_table: Option<u32>,
    /// Top byte of the probe sockets' marks (0x01-0xff; must not be used by other mark users
    /// on the host) [default: 0x53 with the default --pin-dir; with another, one derived
    /// from it].
    #[arg(long, value_name = "BYTE", value_parser = parse_mark_tag)]
    pub probe_mark: Option<u8>,
}

impl VipPathArgs {
    /// The names `lbd` with pin directory `pin_dir` uses: the options', else derived.
    pub fn names(&self, pin_dir: &Path) -> ProbeNames {
        let derived = ProbeNames::for_pin_dir(pin_dir);
        ProbeNames {
            device: self.probe_device.clone().unwrap_or(derived.device),
            table: self.probe_table.unwrap_or(derived.table),
            mark: self.probe_mark.unwrap_or(derived.mark),
        }
    }
}

/// The host-wide names of one `lbd`'s probe path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeNames {
    pub device: String,
    pub table: u32,
    pub mark: u8,
}

impl ProbeNames {
    /// The default pin directory keeps the historic names; any other gets names of its own,
    /// derived from its path (stable across restarts and versions: FNV-1a), so two `lbd`s on
    /// one host (or one's `--cleanup`) never share or remove each other's.
    pub fn for_pin_dir(pin_dir: &Path) -> Self {
        if pin_dir == Path::new(DEFAULT_PIN_DIR) {
            return Self { device: DEFAULT_PROBE_DEVICE.to_owned(), table: DEFAULT_PROBE_TABLE, mark: DEFAULT_PROBE_MARK };
        }
        // Component-wise, so `/a/b/` and `/a//b` are `/a/b`.
        let normal: PathBuf = pin_dir.components().collect();
        let hash = fnv1a(normal.as_os_str().as_bytes());
        // 1-255 without the default's tag.
        let mark = 1 + (hash >> 56) as u8 % 254;
        Self {
            device: format!("spw-p-{:08x}", hash as u32),
            table: DERIVED_TABLE_BASE + ((hash >> 32) % DERIVED_TABLE_SPAN) as u32,
            mark: if mark >= DEFAULT_PROBE_MARK { mark + 1 } else { mark },
        }
    }

    fn routing_error(&self, source: RtnlError) -> VipPathError {
        VipPathError::Routing { device: self.device.clone(), table: self.table, source }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

fn parse_device(name: &str) -> Result<String, String> {
    let valid = !name.is_empty() && name.len() <= MAX_DEVICE_NAME && !name.contains(['/', ':']) && !name.chars().any(char::is_whitespace);
    if valid {
        Ok(name.to_owned())
    } else {
        Err(format!("{name:?}: an interface name is 1 to {MAX_DEVICE_NAME} bytes, no '/', ':' or spaces"))
    }
}

fn parse_table(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        // 0 is "unspecified"; 253-255 are the kernel's default, main and local tables.
        Ok(table @ (1..=252 | 256..)) => Ok(table),
        _ => Err(format!("{text:?}: a routing table number other than 0 and 253-255 (default, main, local)")),
    }
}

fn parse_mark_tag(text: &str) -> Result<u8, String> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.ok().filter(|tag| *tag != 0).ok_or_else(|| format!("{text:?}: a byte from 0x01 to 0xff"))
}

#[derive(Debug, thiserror::Error)]
pub enum VipPathError {
    #[error("probe device {device}: it exists and is not an ifb device (kind {kind}); choose another --probe-device")]
    NotIfb { device: String, kind: String },
    #[error("probe device {device}: creating it (needs ifb support in the kernel, CONFIG_IFB)")]
    CreateDevice {
        device: String,
        #[source]
        source: RtnlError,
    },
    #[error("probe routing (device {device}, table {table})")]
    Routing {
        device: String,
        table: u32,
        #[source]
        source: RtnlError,
    },
    #[error("loading the probe program")]
    Dataplane(#[from] DataplaneError),
    #[error("pinning the probe program at {}", path.display())]
    PinProgram {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("removing the previous probe program's pin {}", path.display())]
    RemovePin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening the pinned probe program {}", path.display())]
    OpenProgram {
        path: PathBuf,
        #[source]
        source: ProgramError,
    },
    #[error("attaching the probe program")]
    Pins(#[from] PinError),
    #[error(transparent)]
    Netif(#[from] NetifError),
}

/// The installed probe path.
pub struct VipPath {
    names: ProbeNames,
    /// Changes when a deleted device is created again.
    device_ifindex: AtomicU32,
    /// The breakage being repaired was logged (once until it is repaired).
    broken_logged: AtomicBool,
    /// The interface the program asks the FIB as if probes arrived on (name, index): the
    /// balancer's first interface that is up (`set_ingress`).
    ingress: Mutex<(String, u32)>,
    /// The probes' source per family; `None`: that family has no probe route.
    source_v4: Option<IpAddr>,
    source_v6: Option<IpAddr>,
    link_path: PathBuf,
    /// The probe program, pinned so that a running `lbd` can attach it again.
    program_path: PathBuf,
    maps: Mutex<ProbeMaps>,
}

impl VipPath {
    /// Creates (or keeps) the device, loads the probe program of `balancer` and attaches it
    /// (taking a pinned link over), then routes marked sockets to the device. Idempotent: a
    /// restarted `lbd` finds everything in place and changes nothing but the program.
    /// `sources`: the probes' source per family, when the caller has one (the balancer's own
    /// address, routed back to it over every interface); else `iface`'s first address.
    pub fn install(
        balancer: &mut Balancer,
        layout: &PinLayout,
        iface: &str,
        names: &ProbeNames,
        sources: (Option<IpAddr>, Option<IpAddr>),
    ) -> Result<Self, VipPathError> {
        let iface_ifindex = netif::ifindex(iface)?;
        let mut rtnl = Rtnl::open().map_err(|source| VipPathError::CreateDevice { device: names.device.clone(), source })?;
        let (program, mut maps) = balancer.load_probe()?;
        maps.set_config(&ProbeConfig { ingress_ifindex: iface_ifindex, mark_tag: u32::from(names.mark) })?;
        let program_path = layout.probe_program();
        pin_program(program, &program_path)?;
        let addrs = netif::addresses()?;
        let path = Self {
            names: names.clone(),
            device_ifindex: AtomicU32::new(0),
            broken_logged: AtomicBool::new(false),
            ingress: Mutex::new((iface.to_owned(), iface_ifindex)),
            source_v4: sources.0.or_else(|| netif::first_ipv4(&addrs, iface).map(IpAddr::V4)),
            source_v6: sources.1.or_else(|| netif::first_global_ipv6(&addrs, iface).map(IpAddr::V6)),
            link_path: layout.probe_link(),
            program_path,
            maps: Mutex::new(maps),
        };
        let (device, link) = (&names.device, path.link_path.display());
        match path.establish(&mut rtnl, program)? {
            Attachment::TookOver { replaced_program_id } => {
                event!(info, "probe_path_took_over", device = device, link = link, replaced_prog_id = replaced_program_id)
            }
            _ => event!(info, "probe_path_attached", device = device, link = link),
        }
        let source = |s: Option<IpAddr>| s.map_or("-".to_owned(), |a| a.to_string());
        event!(
            info,
            "probe_path_ready",
            device = device,
            table = names.table,
            mark = format!("0x{:08x}/0x{PROBE_MARK_TAG_MASK:08x}", u32::from(names.mark) << PROBE_MARK_TAG_SHIFT),
            source_v4 = source(path.source_v4),
            source_v6 = source(path.source_v6)
        );
        Ok(path)
    }

    /// Makes the path whole with `program`: the device (created if missing), the program
    /// attached to it, the table's routes and the rules. Each step keeps what is in place.
    fn establish(&self, rtnl: &mut Rtnl, program: &mut SchedClassifier) -> Result<Attachment, VipPathError> {
        let names = &self.names;
        let link = ensure_device(rtnl, &names.device)?;
        self.device_ifindex.store(link.ifindex, Ordering::Relaxed);
        let attachment = pins::attach_pinned_tc(program, link.ifindex, &names.device, &self.link_path)?;
        for source in [self.source_v4, self.source_v6].into_iter().flatten() {
            rtnl.replace_default_route(names.table, link.ifindex, source).map_err(|e| names.routing_error(e))?;
        }
        for rule in rules(names) {
            rtnl.add_rule(&rule).map_err(|e| names.routing_error(e))?;
        }
        Ok(attachment)
    }

    /// Checks the path and, if any of it is gone (the device, the program's link, a route or
    /// a rule), restores it from the pinned program, logging both (the first as an ALERT).
    /// Returns what was missing (empty: nothing).
    pub fn repair(&self) -> Result<Vec<&'static str>, VipPathError> {
        let names = &self.names;
        let mut rtnl = Rtnl::open().map_err(|e| names.routing_error(e))?;
        let missing = self.missing(&mut rtnl);
        if missing.is_empty() {
            return Ok(missing);
        }
        if !self.broken_logged.swap(true, Ordering::Relaxed) {
            event!(
                error,
                "probe_path_broken",
                device = names.device,
                table = names.table,
                missing = missing.join(","),
                message = "ALERT: probes through the tunnel count as unknown until lbd restores the probe path"
            );
        }
        let path = &self.program_path;
        let mut program = SchedClassifier::from_pin(path).map_err(|source| VipPathError::OpenProgram { path: path.clone(), source })?;
        self.establish(&mut rtnl, &mut program)?;
        self.broken_logged.store(false, Ordering::Relaxed);
        event!(warn, "probe_path_restored", device = names.device, table = names.table, restored = missing.join(","));
        Ok(missing)
    }

    /// What of the path is gone: `device`, `program` (its link), `routing` (a rule or a
    /// route of a family with a probe source).
    fn missing(&self, rtnl: &mut Rtnl) -> Vec<&'static str> {
        let dsts = [(self.source_v4, CHECK_DST_V4), (self.source_v6, CHECK_DST_V6)];
        let routing_broken = dsts.iter().filter(|(source, _)| source.is_some()).any(|(_, dst)| self.unrouted(rtnl, *dst).is_some());
        [(self.device_gone(rtnl).is_some(), "device"), (self.detached().is_some(), "program"), (routing_broken, "routing")]
            .into_iter()
            .filter_map(|(gone, what)| gone.then_some(what))
            .collect()
    }

    fn detached(&self) -> Option<String> {
        (pins::pinned_link_ifindex(&self.link_path) != Some(self.device_ifindex.load(Ordering::Relaxed))).then(|| {
            format!(
                "the probe program is not attached to {} (its link {} is gone or detached)",
                self.names.device,
                self.link_path.display()
            )
        })
    }

    fn device_gone(&self, rtnl: &mut Rtnl) -> Option<String> {
        let device = &self.names.device;
        match rtnl.link(device) {
            Ok(Some(Link { ifindex, up: true, .. })) if ifindex == self.device_ifindex.load(Ordering::Relaxed) => None,
            Ok(_) => Some(format!("the probe device {device} is gone or down")),
            Err(e) => Some(format!("checking the probe device {device}: {e}")),
        }
    }

    /// Why sockets with this path's mark are not routed to its device, toward `dst`.
    fn unrouted(&self, rtnl: &mut Rtnl, dst: IpAddr) -> Option<String> {
        let mark = u32::from(self.names.mark) << PROBE_MARK_TAG_SHIFT;
        let routed = rtnl.route(&Lookup { dst, src: None, iif: None, mark: Some(mark) });
        (!matches!(routed, Ok(route) if route.oif == Some(self.device_ifindex.load(Ordering::Relaxed)))).then(|| {
            format!(
                "probes to {dst} are not routed to {} (ip rule fwmark 0x{mark:08x}/0x{PROBE_MARK_TAG_MASK:08x} lookup {} missing?)",
                self.names.device, self.names.table
            )
        })
    }

    /// Why a probe to `vip` would not go through the probe path now (program detached, device
    /// gone, not routed to it); `None` when it would.
    pub fn broken_for(&self, vip: IpAddr) -> Option<String> {
        if let Some(why) = self.detached() {
            return Some(why);
        }
        let mut rtnl = match Rtnl::open() {
            Ok(rtnl) => rtnl,
            Err(e) => return Some(format!("checking the probe path: {e}")),
        };
        self.device_gone(&mut rtnl).or_else(|| self.unrouted(&mut rtnl, vip))
    }

    /// Removes the rules and the device (its routes go with it); what is already gone is
    /// fine. A device of that name that is not an ifb is left alone. The pinned link goes
    /// with the pin directory (`pins::cleanup`).
    pub fn remove(names: &ProbeNames) -> Result<(), VipPathError> {
        let device = &names.device;
        let routing = |source| names.routing_error(source);
        let mut rtnl = Rtnl::open().map_err(routing)?;
        for rule in rules(names) {
            rtnl.del_rule(&rule).map_err(routing)?;
        }
        if let Some(link) = rtnl.link(device).map_err(routing)?
            && link.kind.as_deref() == Some("ifb")
        {
            rtnl.del_link(link.ifindex).map_err(routing)?;
            event!(info, "probe_path_removed", device = device);
        }
        Ok(())
    }

    /// The mark of a probe to backend `id` of generation `generation`.
    /// Routes the probes as if they arrived on `iface` (index `ifindex`): the balancer's
    /// first interface that is up, so that probes leave while any uplink can carry them.
    pub fn set_ingress(&self, iface: &str, ifindex: u32) -> Result<(), VipPathError> {
        let mut ingress = self.ingress.lock().unwrap_or_else(|p| p.into_inner());
        if ingress.1 == ifindex {
            return Ok(());
        }
        let mark_tag = u32::from(self.names.mark);
        self.maps.lock().unwrap_or_else(|p| p.into_inner()).set_config(&ProbeConfig { ingress_ifindex: ifindex, mark_tag })?;
        event!(info, "probe_path_ingress", iface = iface, was = ingress.0);
        *ingress = (iface.to_owned(), ifindex);
        Ok(())
    }

    fn ingress(&self) -> (String, u32) {
        self.ingress.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn mark(&self, id: u32, generation: u32) -> u32 {
        probe_mark(self.names.mark, id, generation)
    }

    /// Why a probe to `vip` cannot go through the tunnel from here at all (no source of its
    /// family); `None` when it can.
    pub fn unroutable(&self, vip: IpAddr) -> Option<String> {
        self.source(Family::of(&vip)).is_none().then(|| {
            let family = if vip.is_ipv4() { "IPv4" } else { "IPv6" };
            format!("{} has no {family} address for probes to {vip} to come from", self.ingress().0)
        })
    }

    fn source(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.source_v4,
            Family::V6 => self.source_v6,
        }
    }

    /// After a probe of `vip` (to backend `id`) failed through the tunnel while a direct
    /// probe passed: the balancer's own reason, if it has one. Checks, in order, that the
    /// program is attached to the device, that marked sockets are routed to it, that the
    /// program sent the backend's last probe on, and (IPv4) that the balancer accepts replies
    /// from the VIP on its interface (`rp_filter`).
    pub fn local_problem(&self, vip: IpAddr, id: u32) -> Option<String> {
        if let Some(why) = self.broken_for(vip) {
            return Some(why);
        }
        let last = self.maps.lock().unwrap_or_else(|p| p.into_inner()).last(id);
        match last {
            Ok(None | Some(ProbeReason::Redirect | ProbeReason::RedirectNeigh)) => {}
            Ok(Some(reason)) => return Some(format!("the probe program did not send the probe on: {}", reason.label())),
            Err(e) => return Some(format!("reading the probe program's verdicts: {e}")),
        }
        // IPv6 has no reverse-path filter in the routing code.
        if let (IpAddr::V4(_), Some(source)) = (vip, self.source_v4) {
            let (iface, ifindex) = self.ingress();
            let reply =
                Rtnl::open().and_then(|mut rtnl| rtnl.route(&Lookup { dst: source, src: Some(vip), iif: Some(ifindex), mark: None }));
            if !matches!(reply, Ok(route) if route.kind == RTN_LOCAL) {
                return Some(format!(
                    "this host drops replies from {vip} to {source} arriving on {}: its reverse-path filter (rp_filter) wants a route \
                     to {vip} (loose mode) or one through {} (strict mode); or set net.ipv4.conf.{}.rp_filter=0",
                    iface, iface, iface
                ));
            }
        }
        None
    }
}

/// The device, created if missing, refused if it is not an ifb, set up if down.
fn ensure_device(rtnl: &mut Rtnl, device: &str) -> Result<Link, VipPathError> {
    let create = |source| VipPathError::CreateDevice { device: device.to_owned(), source };
    let link = match rtnl.link(device).map_err(create)? {
        Some(link) => link,
        None => {
            rtnl.add_ifb(device).map_err(create)?;
            event!(info, "probe_device_created", device = device, kind = "ifb");
            rtnl.link(device).map_err(create)?.ok_or(create(RtnlError::Malformed { op: "get link" }))?
        }
    };
    match link.kind.as_deref() {
        Some("ifb") => {}
        kind => return Err(VipPathError::NotIfb { device: device.to_owned(), kind: kind.unwrap_or("none").to_owned() }),
    }
    if !link.up {
        rtnl.set_up(link.ifindex).map_err(create)?;
    }
    Ok(link)
}

/// Pins the freshly loaded probe program at `path`, replacing the previous `lbd`'s pin.
fn pin_program(program: &mut SchedClassifier, path: &Path) -> Result<(), VipPathError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(VipPathError::RemovePin { path: path.to_owned(), source }),
    }
    program.pin(path).map_err(|source| VipPathError::PinProgram { path: path.to_owned(), source })
}

fn rules(names: &ProbeNames) -> [MarkRule; 2] {
    let mark = u32::from(names.mark) << PROBE_MARK_TAG_SHIFT;
    [Family::V4, Family::V6].map(|family| MarkRule { family, mark, mask: PROBE_MARK_TAG_MASK, table: names.table, priority: RULE_PRIORITY })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        assert_eq!(parse_device("spw-probe"), Ok("spw-probe".to_owned()));
        for bad in ["", "a-name-far-too-long", "a/b", "a b", "a:1"] {
            assert!(parse_device(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_table("5357"), Ok(5357));
        assert_eq!(parse_table("1000000"), Ok(1_000_000));
        for bad in ["0", "253", "254", "255", "-1", "main"] {
            assert!(parse_table(bad).unwrap_err().contains("routing table"), "{bad:?}");
        }
        assert_eq!((parse_mark_tag("0x53"), parse_mark_tag("200")), (Ok(0x53), Ok(200)));
        for bad in ["0", "0x0", "256", "0x100", "x"] {
            assert!(parse_mark_tag(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_pin_directory_has_probe_names_of_its_own() {
        let default = ProbeNames::for_pin_dir(Path::new(DEFAULT_PIN_DIR));
        assert_eq!(default, ProbeNames { device: "spw-probe".into(), table: 5357, mark: 0x53 }, "existing installs keep theirs");
        assert_eq!(ProbeNames::for_pin_dir(Path::new("/sys/fs/bpf/spillway/")), default);
        let dirs: Vec<String> = (0..500).map(|i| format!("/sys/fs/bpf/t{i}/lb")).collect();
        let all: Vec<ProbeNames> = dirs.iter().map(|d| ProbeNames::for_pin_dir(Path::new(d))).collect();
        for names in &all {
            assert!(parse_device(&names.device).is_ok() && names.device.starts_with("spw-p-"), "{names:?}");
            assert_eq!(parse_table(&names.table.to_string()), Ok(names.table));
            assert!((DERIVED_TABLE_BASE..=DERIVED_TABLE_BASE + 0xff_ffff).contains(&names.table), "{names:?}");
            assert!(names.mark != 0 && names.mark != DEFAULT_PROBE_MARK, "{names:?}");
        }
        let devices: std::collections::BTreeSet<&str> = all.iter().map(|n| n.device.as_str()).collect();
        let tables: std::collections::BTreeSet<u32> = all.iter().map(|n| n.table).collect();
        assert_eq!((devices.len(), tables.len()), (all.len(), all.len()), "distinct per pin directory");
        // Stable: the same directory, however written, gets the same names.
        assert_eq!(ProbeNames::for_pin_dir(Path::new("/sys/fs/bpf//t7/lb/")), all[7]);
    }

    #[test]
    fn rules_match_the_tag_byte_only() {
        let names = ProbeNames { device: "d".into(), table: 7, mark: 0x53 };
        for rule in rules(&names) {
            assert_eq!((rule.mark, rule.mask, rule.table, rule.priority), (0x5300_0000, 0xff00_0000, 7, RULE_PRIORITY));
            assert_eq!(probe_mark(0x53, 4095, 9) & rule.mask, rule.mark);
        }
    }
}
