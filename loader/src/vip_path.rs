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
//! removes them all. [`VipPath::local_problem`] tells the balancer's own trouble (program
//! detached, rule gone, replies dropped by its reverse-path filter) from the backend's, so a
//! probe failing for the balancer's reasons is `Unknown`, never a backend failure.

use std::{net::IpAddr, path::PathBuf, sync::Mutex};

use clap::Args;
use spillway_common::types::{PROBE_MARK_TAG_MASK, PROBE_MARK_TAG_SHIFT, ProbeConfig, ProbeReason, probe_mark};

use crate::{
    dataplane::{Balancer, DataplaneError, ProbeMaps},
    event,
    netif::{self, NetifError},
    pins::{self, Attachment, PinError, PinLayout},
    rtnl::{Family, Link, Lookup, MarkRule, RTN_LOCAL, Rtnl, RtnlError},
};

/// Priority of the mark rules: ahead of the main table and of the usual policy rules (a
/// VRF's is 1000); they match nothing but probe marks.
pub const RULE_PRIORITY: u32 = 100;
/// Longest interface name (IFNAMSIZ - 1).
const MAX_DEVICE_NAME: usize = 15;

/// `lbd`'s options for the probe path.
#[derive(Clone, Debug, Args)]
pub struct VipPathArgs {
    /// Device lbd creates for probes through the tunnel: an ifb, which drops anything the
    /// probe program does not send on.
    #[arg(long, value_name = "NAME", default_value = "spw-probe", value_parser = parse_device)]
    pub probe_device: String,
    /// Routing table for the probe sockets (chosen by their mark).
    #[arg(long, value_name = "N", default_value_t = 5357, value_parser = parse_table)]
    pub probe_table: u32,
    /// Top byte of the probe sockets' marks (0x01-0xff; must not be used by other mark users
    /// on the host).
    #[arg(long, value_name = "BYTE", default_value = "0x53", value_parser = parse_mark_tag)]
    pub probe_mark: u8,
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
    #[error("attaching the probe program")]
    Pins(#[from] PinError),
    #[error(transparent)]
    Netif(#[from] NetifError),
}

/// The installed probe path.
pub struct VipPath {
    args: VipPathArgs,
    device_ifindex: u32,
    iface: String,
    iface_ifindex: u32,
    /// The probes' source per family (the interface's first address); `None`: that family
    /// has no probe route.
    source_v4: Option<IpAddr>,
    source_v6: Option<IpAddr>,
    link_path: PathBuf,
    maps: Mutex<ProbeMaps>,
}

impl VipPath {
    /// Creates (or keeps) the device, loads the probe program of `balancer` and attaches it
    /// (taking a pinned link over), then routes marked sockets to the device. Idempotent: a
    /// restarted `lbd` finds everything in place and changes nothing but the program.
    pub fn install(balancer: &mut Balancer, layout: &PinLayout, iface: &str, args: &VipPathArgs) -> Result<Self, VipPathError> {
        let device = &args.probe_device;
        let iface_ifindex = netif::ifindex(iface)?;
        let mut rtnl = Rtnl::open().map_err(|source| VipPathError::CreateDevice { device: device.clone(), source })?;
        let link = ensure_device(&mut rtnl, device)?;
        let (program, mut maps) = balancer.load_probe()?;
        maps.set_config(&ProbeConfig { ingress_ifindex: iface_ifindex, mark_tag: u32::from(args.probe_mark) })?;
        let link_path = layout.probe_link();
        match pins::attach_pinned_tc(program, link.ifindex, device, &link_path)? {
            Attachment::TookOver { replaced_program_id } => {
                event!(info, "probe_path_took_over", device = device, link = link_path.display(), replaced_prog_id = replaced_program_id)
            }
            _ => event!(info, "probe_path_attached", device = device, link = link_path.display()),
        }
        let addrs = netif::addresses()?;
        let source_v4 = netif::first_ipv4(&addrs, iface).map(IpAddr::V4);
        let source_v6 = netif::first_global_ipv6(&addrs, iface).map(IpAddr::V6);
        let routing = |source| VipPathError::Routing { device: device.clone(), table: args.probe_table, source };
        for source in [source_v4, source_v6].into_iter().flatten() {
            rtnl.replace_default_route(args.probe_table, link.ifindex, source).map_err(routing)?;
        }
        for rule in rules(args) {
            rtnl.add_rule(&rule).map_err(routing)?;
        }
        let source = |s: Option<IpAddr>| s.map_or("-".to_owned(), |a| a.to_string());
        event!(
            info,
            "probe_path_ready",
            device = device,
            table = args.probe_table,
            mark = format!("0x{:08x}/0x{PROBE_MARK_TAG_MASK:08x}", u32::from(args.probe_mark) << PROBE_MARK_TAG_SHIFT),
            source_v4 = source(source_v4),
            source_v6 = source(source_v6)
        );
        Ok(Self {
            args: args.clone(),
            device_ifindex: link.ifindex,
            iface: iface.to_owned(),
            iface_ifindex,
            source_v4,
            source_v6,
            link_path,
            maps: Mutex::new(maps),
        })
    }

    /// Removes the rules and the device (its routes go with it); what is already gone is
    /// fine. A device of that name that is not an ifb is left alone. The pinned link goes
    /// with the pin directory (`pins::cleanup`).
    pub fn remove(args: &VipPathArgs) -> Result<(), VipPathError> {
        let device = &args.probe_device;
        let routing = |source| VipPathError::Routing { device: device.clone(), table: args.probe_table, source };
        let mut rtnl = Rtnl::open().map_err(routing)?;
        for rule in rules(args) {
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
    pub fn mark(&self, id: u32, generation: u32) -> u32 {
        probe_mark(self.args.probe_mark, id, generation)
    }

    /// Why a probe to `vip` cannot go through the tunnel from here at all (no source of its
    /// family); `None` when it can.
    pub fn unroutable(&self, vip: IpAddr) -> Option<String> {
        self.source(Family::of(&vip)).is_none().then(|| {
            let family = if vip.is_ipv4() { "IPv4" } else { "IPv6" };
            format!("{} has no {family} address for probes to {vip} to come from", self.iface)
        })
    }

    fn source(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.source_v4,
            Family::V6 => self.source_v6,
        }
    }

    /// After a probe of `vip` with `mark` (to backend `id`) failed through the tunnel while a
    /// direct probe passed: the balancer's own reason, if it has one. Checks, in order, that
    /// the program is attached to the device, that marked sockets are routed to it, that the
    /// program sent the backend's last probe on, and (IPv4) that the balancer accepts replies
    /// from the VIP on its interface (`rp_filter`).
    pub fn local_problem(&self, vip: IpAddr, mark: u32, id: u32) -> Option<String> {
        let device = &self.args.probe_device;
        if pins::pinned_link_ifindex(&self.link_path) != Some(self.device_ifindex) {
            return Some(format!(
                "the probe program is not attached to {device} (its link {} is gone or detached)",
                self.link_path.display()
            ));
        }
        let mut rtnl = match Rtnl::open() {
            Ok(rtnl) => rtnl,
            Err(e) => return Some(format!("checking the probe path: {e}")),
        };
        match rtnl.link(device) {
            Ok(Some(Link { ifindex, up: true, .. })) if ifindex == self.device_ifindex => {}
            Ok(_) => return Some(format!("the probe device {device} is gone or down")),
            Err(e) => return Some(format!("checking the probe device {device}: {e}")),
        }
        let routed = rtnl.route(&Lookup { dst: vip, src: None, iif: None, mark: Some(mark) });
        if !matches!(routed, Ok(route) if route.oif == Some(self.device_ifindex)) {
            return Some(format!(
                "probes to {vip} are not routed to {device} (ip rule fwmark 0x{:08x}/0x{PROBE_MARK_TAG_MASK:08x} lookup {} missing?)",
                mark & PROBE_MARK_TAG_MASK,
                self.args.probe_table
            ));
        }
        let last = self.maps.lock().unwrap_or_else(|p| p.into_inner()).last(id);
        match last {
            Ok(None | Some(ProbeReason::Redirect | ProbeReason::RedirectNeigh)) => {}
            Ok(Some(reason)) => return Some(format!("the probe program did not send the probe on: {}", reason.label())),
            Err(e) => return Some(format!("reading the probe program's verdicts: {e}")),
        }
        // IPv6 has no reverse-path filter in the routing code.
        if let (IpAddr::V4(_), Some(source)) = (vip, self.source_v4) {
            let reply = rtnl.route(&Lookup { dst: source, src: Some(vip), iif: Some(self.iface_ifindex), mark: None });
            if !matches!(reply, Ok(route) if route.kind == RTN_LOCAL) {
                return Some(format!(
                    "this host drops replies from {vip} to {source} arriving on {}: its reverse-path filter (rp_filter) wants a route \
                     to {vip} (loose mode) or one through {} (strict mode); or set net.ipv4.conf.{}.rp_filter=0",
                    self.iface, self.iface, self.iface
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

fn rules(args: &VipPathArgs) -> [MarkRule; 2] {
    let mark = u32::from(args.probe_mark) << PROBE_MARK_TAG_SHIFT;
    [Family::V4, Family::V6].map(|family| MarkRule {
        family,
        mark,
        mask: PROBE_MARK_TAG_MASK,
        table: args.probe_table,
        priority: RULE_PRIORITY,
    })
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
    fn rules_match_the_tag_byte_only() {
        let args = VipPathArgs { probe_device: "d".into(), probe_table: 7, probe_mark: 0x53 };
        for rule in rules(&args) {
            assert_eq!((rule.mark, rule.mask, rule.table, rule.priority), (0x5300_0000, 0xff00_0000, 7, RULE_PRIORITY));
            assert_eq!(probe_mark(0x53, 4095, 9) & rule.mask, rule.mark);
        }
    }
}
