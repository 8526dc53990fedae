//! The few rtnetlink requests `lbd` makes for its probe path: a device, a routing table
//! behind a mark rule, and route lookups that tell whether the kernel routes as expected.
//! One request at a time, each answered before the next (no dumps, no async).

use std::{
    net::IpAddr,
    os::fd::{AsRawFd, OwnedFd},
};

use nix::{
    errno::Errno,
    sys::{
        socket::{AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, setsockopt, socket, sockopt},
        time::TimeVal,
    },
};

// linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/fib_rules.h
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const IFINFOMSG_LEN: usize = 16;
const RTMSG_LEN: usize = 12;
const FIB_RULE_HDR_LEN: usize = 12;
const IFF_UP: u32 = 0x1;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_STATS64: u16 = 23;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_PROG_ID: u16 = 4;
/// `struct rtnl_link_stats64`: rx/tx packets, rx/tx bytes, rx/tx errors, rx_dropped, then
/// tx_dropped.
const STATS64_TX_DROPPED: usize = 7 * 8;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_AF_SPEC: u16 = 26;
const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
const IN6_ADDR_GEN_MODE_NONE: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_IIF: u16 = 3;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;
const RTA_MARK: u16 = 16;
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;
pub const RTN_LOCAL: u8 = 2;
const FR_ACT_TO_TBL: u8 = 1;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// Largest answer read: a link or route message is a few hundred bytes.
const RECV_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    #[error("netlink {op}")]
    Kernel {
        op: &'static str,
        #[source]
        errno: Errno,
    },
    #[error("netlink {op}: the kernel's answer is malformed")]
    Malformed { op: &'static str },
}

impl RtnlError {
    /// The kernel's errno, when it refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            Self::Malformed { .. } => None,
        }
    }
}

/// An IP family, as rtnetlink numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: &IpAddr) -> Self {
        if addr.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    const fn number(self) -> u8 {
        match self {
            Family::V4 => AF_INET,
            Family::V6 => AF_INET6,
        }
    }

    const fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// A device as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    /// The driver kind (`ifb`, `veth`, ...); `None` for devices without one (physical NICs).
    pub kind: Option<String>,
    pub up: bool,
    /// Frames the device dropped on the way out (`tx_dropped`; on a veth, also frames
    /// XDP_TX or a redirect could not hand to its peer).
    pub tx_dropped: Option<u64>,
    /// The XDP program driving the device (`None`: none).
    pub xdp_prog_id: Option<u32>,
}

/// What a route lookup answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// `RTN_UNICAST`, `RTN_LOCAL`, ...
    pub kind: u8,
    pub oif: Option<u32>,
}

/// A route lookup (`ip route get`): `dst`, optionally from `src`, as a packet arriving on
/// `iif` (an input lookup, with the reverse-path check) or sent with socket mark `mark`.
#[derive(Clone, Copy, Debug)]
pub struct Lookup {
    pub dst: IpAddr,
    pub src: Option<IpAddr>,
    pub iif: Option<u32>,
    pub mark: Option<u32>,
}

/// A rule sending packets whose mark matches `mark` under `mask` to `table`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkRule {
    pub family: Family,
    pub mark: u32,
    pub mask: u32,
    pub table: u32,
    pub priority: u32,
}

pub struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> Result<Self, RtnlError> {
        let kernel = |errno| RtnlError::Kernel { op: "socket", errno };
        let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute).map_err(kernel)?;
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(2, 0)).map_err(kernel)?;
        Ok(Self { fd, seq: 0 })
    }

    /// The device named `name`, if there is one.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>, RtnlError> {
        let mut msg = Message::new(RTM_GETLINK, 0, &[0; IFINFOMSG_LEN]);
        msg.attr(IFLA_IFNAME, &nul_terminated(name));
        match self.call("get link", msg) {
            Ok(answer) => parse_link(&answer).map(Some).ok_or(RtnlError::Malformed { op: "get link" }),
            Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates an `ifb` device named `name`, down. Fails with EEXIST if the name is taken.
    pub fn add_ifb(&mut self, name: &str) -> Result<(), RtnlError> {
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, &ifinfomsg(0, false));
        msg.attr(IFLA_IFNAME, &nul_terminated(name));
        msg.nested(IFLA_LINKINFO, |m| m.attr(IFLA_INFO_KIND, b"ifb"));
        self.call("add link", msg).map(drop)
    }

    /// Sets device `ifindex` up, without IPv6 addresses of its own (no link-local address, so
    /// nothing but what is routed to it is ever sent through it).
    pub fn set_up(&mut self, ifindex: u32) -> Result<(), RtnlError> {
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_ACK, &ifinfomsg(ifindex, false));
        msg.nested(IFLA_AF_SPEC, |m| m.nested(u16::from(AF_INET6), |m| m.attr(IFLA_INET6_ADDR_GEN_MODE, &[IN6_ADDR_GEN_MODE_NONE])));
        self.call("set IPv6 address generation", msg)?;
        self.call("set link up", Message::new(RTM_NEWLINK, NLM_F_ACK, &ifinfomsg(ifindex, true))).map(drop)
    }

    /// Deletes device `ifindex` (its routes go with it).
    pub fn del_link(&mut self, ifindex: u32) -> Result<(), RtnlError> {
        self.call("delete link", Message::new(RTM_DELLINK, NLM_F_ACK, &ifinfomsg(ifindex, false))).map(drop)
    }

    /// Makes `table`'s default route of `family` go out of `oif` with source `src`.
    pub fn replace_default_route(&mut self, table: u32, oif: u32, src: IpAddr) -> Result<(), RtnlError> {
        let family = Family::of(&src);
        let scope = if family == Family::V4 { RT_SCOPE_LINK } else { RT_SCOPE_UNIVERSE };
        let mut msg = Message::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK, &rtmsg(family, 0, 0, RTPROT_STATIC, scope));
        msg.attr(RTA_TABLE, &table.to_ne_bytes());
        msg.attr(RTA_OIF, &oif.to_ne_bytes());
        msg.attr(RTA_PREFSRC, &octets(&src));
        self.call("replace route", msg).map(drop)
    }

    /// Adds `rule`; one already there is kept.
    pub fn add_rule(&mut self, rule: &MarkRule) -> Result<(), RtnlError> {
        match self.call("add rule", rule_message(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, rule)) {
            Err(e) if e.errno() == Some(Errno::EEXIST) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Removes `rule`; one already gone is fine.
    pub fn del_rule(&mut self, rule: &MarkRule) -> Result<(), RtnlError> {
        match self.call("delete rule", rule_message(RTM_DELRULE, NLM_F_ACK, rule)) {
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Asks the kernel how it routes `lookup`; its refusal (no route, a reverse-path check
    /// failing) is the error.
    pub fn route(&mut self, lookup: &Lookup) -> Result<Route, RtnlError> {
        let family = Family::of(&lookup.dst);
        let src_len = if lookup.src.is_some() { family.bits() } else { 0 };
        let mut msg = Message::new(RTM_GETROUTE, 0, &rtmsg(family, family.bits(), src_len, 0, 0));
        msg.attr(RTA_DST, &octets(&lookup.dst));
        if let Some(src) = &lookup.src {
            msg.attr(RTA_SRC, &octets(src));
        }
        if let Some(iif) = lookup.iif {
            msg.attr(RTA_IIF, &iif.to_ne_bytes());
        }
        if let Some(mark) = lookup.mark {
            msg.attr(RTA_MARK, &mark.to_ne_bytes());
        }
        let answer = self.call("get route", msg)?;
        parse_route(&answer).ok_or(RtnlError::Malformed { op: "get route" })
    }

    /// Sends one request and returns the body of its answer (empty for an acknowledgement).
    fn call(&mut self, op: &'static str, mut msg: Message) -> Result<Vec<u8>, RtnlError> {
        self.seq = self.seq.wrapping_add(1);
        let request = msg.finish(self.seq);
        let kernel = |errno| RtnlError::Kernel { op, errno };
        sendto(self.fd.as_raw_fd(), &request, &NetlinkAddr::new(0, 0), MsgFlags::empty()).map_err(kernel)?;
        let mut buf = vec![0u8; RECV_BYTES];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(kernel)?;
            match answer(&buf[..n], self.seq) {
                Answer::Data(body) => return Ok(body.to_vec()),
                Answer::Ack => return Ok(Vec::new()),
                Answer::Error(code) => return Err(kernel(Errno::from_raw(code))),
                // An answer to an earlier request that timed out.
                Answer::Stale => continue,
                Answer::Malformed => return Err(RtnlError::Malformed { op }),
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum Answer<'a> {
    Data(&'a [u8]),
    Ack,
    Error(i32),
    Stale,
    Malformed,
}

/// The first message of a received batch, if it answers request `seq`.
pub(crate) fn answer(buf: &[u8], seq: u32) -> Answer<'_> {
    let (Some(len), Some(kind), Some(got_seq)) = (u32_at(buf, 0), u16_at(buf, 4), u32_at(buf, 8)) else {
        return Answer::Malformed;
    };
    let len = len as usize;
    if len < NLMSG_HDRLEN || len > buf.len() {
        return Answer::Malformed;
    }
    if got_seq != seq {
        return Answer::Stale;
    }
    let body = &buf[NLMSG_HDRLEN..len];
    if kind != NLMSG_ERROR {
        return Answer::Data(body);
    }
    // The kernel sends minus the errno; i32::MIN has no errno to be minus of.
    match u32_at(body, 0).map(|c| (c as i32).checked_neg()) {
        Some(Some(0)) => Answer::Ack,
        Some(Some(errno)) => Answer::Error(errno),
        Some(None) | None => Answer::Malformed,
    }
}

/// A request under construction: header, fixed part, attributes.
struct Message {
    buf: Vec<u8>,
}

impl Message {
    fn new(kind: u16, flags: u16, fixed: &[u8]) -> Self {
        let mut buf = vec![0u8; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        buf.extend_from_slice(fixed);
        Self { buf }
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        self.buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Message)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        fill(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(&mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        std::mem::take(&mut self.buf)
    }
}

/// An ifinfomsg for device `ifindex` (0: by name), setting it up when `up`.
fn ifinfomsg(ifindex: u32, up: bool) -> [u8; IFINFOMSG_LEN] {
    // family, pad, type, index, flags, change
    let mut m = [0u8; IFINFOMSG_LEN];
    m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    if up {
        m[8..12].copy_from_slice(&IFF_UP.to_ne_bytes());
        m[12..16].copy_from_slice(&IFF_UP.to_ne_bytes());
    }
    m
}

fn rtmsg(family: Family, dst_len: u8, src_len: u8, protocol: u8, scope: u8) -> [u8; RTMSG_LEN] {
    // family, dst_len, src_len, tos, table, protocol, scope, type, flags
    let table = 0; // RT_TABLE_UNSPEC: the table is RTA_TABLE, which takes any number
    [family.number(), dst_len, src_len, 0, table, protocol, scope, RTN_UNICAST, 0, 0, 0, 0]
}

fn rule_message(kind: u16, flags: u16, rule: &MarkRule) -> Message {
    // family, dst_len, src_len, tos, table, res1, res2, action, flags
    let hdr: [u8; FIB_RULE_HDR_LEN] = [rule.family.number(), 0, 0, 0, 0, 0, 0, FR_ACT_TO_TBL, 0, 0, 0, 0];
    let mut msg = Message::new(kind, flags, &hdr);
    msg.attr(FRA_PRIORITY, &rule.priority.to_ne_bytes());
    msg.attr(FRA_FWMARK, &rule.mark.to_ne_bytes());
    msg.attr(FRA_FWMASK, &rule.mask.to_ne_bytes());
    msg.attr(FRA_TABLE, &rule.table.to_ne_bytes());
    msg
}

pub(crate) fn parse_link(body: &[u8]) -> Option<Link> {
    let ifindex = u32_at(body, 4)?;
    let up = u32_at(body, 8)? & IFF_UP != 0;
    let linkinfo = attrs(body.get(IFINFOMSG_LEN..)?).find(|(kind, _)| kind & !NLA_F_NESTED == IFLA_LINKINFO);
    let kind = linkinfo.and_then(|(_, info)| attrs(info).find(|(kind, _)| *kind == IFLA_INFO_KIND)).map(|(_, name)| {
        let name = name.strip_suffix(&[0]).unwrap_or(name);
        String::from_utf8_lossy(name).into_owned()
    });
    let tx_dropped = attrs(body.get(IFINFOMSG_LEN..)?)
        .find(|(kind, _)| *kind == IFLA_STATS64)
        .and_then(|(_, stats)| Some(u64::from_ne_bytes(stats.get(STATS64_TX_DROPPED..STATS64_TX_DROPPED + 8)?.try_into().ok()?)));
    let xdp_prog_id = attrs(body.get(IFINFOMSG_LEN..)?)
        .find(|(kind, _)| kind & !NLA_F_NESTED == IFLA_XDP)
        .and_then(|(_, xdp)| attrs(xdp).find(|(kind, _)| *kind == IFLA_XDP_PROG_ID))
        .and_then(|(_, id)| u32_at(id, 0))
        .filter(|id| *id != 0);
    Some(Link { ifindex, kind, up, tx_dropped, xdp_prog_id })
}

pub(crate) fn parse_route(body: &[u8]) -> Option<Route> {
    let kind = *body.get(7)?;
    let oif = attrs(body.get(RTMSG_LEN..)?).find(|(kind, _)| *kind == RTA_OIF).and_then(|(_, data)| u32_at(data, 0));
    Some(Route { kind, oif })
}

/// The (type, data) of each attribute in `buf`; stops at the first malformed one.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16_at(buf, 0)? as usize;
        let kind = u16_at(buf, 2)?;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((kind, data))
    })
}

fn nul_terminated(name: &str) -> Vec<u8> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

fn octets(addr: &IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Netlink messages and attributes are padded to 4 bytes.
pub(crate) const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

pub(crate) fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_laid_out_as_the_kernel_reads_them() {
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_ACK, &ifinfomsg(7, true));
        msg.attr(IFLA_IFNAME, &nul_terminated("ab"));
        msg.nested(IFLA_LINKINFO, |m| m.attr(IFLA_INFO_KIND, b"ifb"));
        let bytes = msg.finish(9);
        assert_eq!(u32_at(&bytes, 0), Some(bytes.len() as u32));
        assert_eq!(
            (u16_at(&bytes, 4), u16_at(&bytes, 6), u32_at(&bytes, 8)),
            (Some(RTM_NEWLINK), Some(NLM_F_REQUEST | NLM_F_ACK), Some(9))
        );
        let body = &bytes[NLMSG_HDRLEN..];
        assert_eq!((u32_at(body, 4), u32_at(body, 8), u32_at(body, 12)), (Some(7), Some(IFF_UP), Some(IFF_UP)));
        let found: Vec<(u16, Vec<u8>)> = attrs(&body[IFINFOMSG_LEN..]).map(|(k, d)| (k, d.to_vec())).collect();
        assert_eq!(found[0], (IFLA_IFNAME, b"ab\0".to_vec()));
        assert_eq!(found[1].0, IFLA_LINKINFO | NLA_F_NESTED);
        assert_eq!(attrs(&found[1].1).map(|(k, d)| (k, d.to_vec())).collect::<Vec<_>>(), [(IFLA_INFO_KIND, b"ifb".to_vec())]);
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn answers_are_matched_to_their_request() {
        let message = |kind: u16, seq: u32, body: &[u8]| {
            let mut m = Message::new(kind, 0, body);
            m.finish(seq)
        };
        assert!(matches!(answer(&message(NLMSG_ERROR, 3, &0i32.to_ne_bytes()), 3), Answer::Ack));
        assert!(matches!(answer(&message(NLMSG_ERROR, 3, &(-17i32).to_ne_bytes()), 3), Answer::Error(17)));
        assert!(matches!(answer(&message(NLMSG_ERROR, 2, &(-17i32).to_ne_bytes()), 3), Answer::Stale));
        assert!(matches!(answer(&message(RTM_NEWROUTE, 3, &[1, 2]), 3), Answer::Data([1, 2])));
        assert!(matches!(answer(&[1, 2, 3], 3), Answer::Malformed));
    }

    /// Found by the fuzz target `netlink`: negating it overflowed (a panic with overflow checks).
    #[test]
    fn an_error_code_without_an_errno_is_malformed() {
        let message = Message::new(NLMSG_ERROR, 0, &i32::MIN.to_ne_bytes()).finish(3);
        assert!(matches!(answer(&message, 3), Answer::Malformed));
    }

    #[test]
    fn lookups_in_this_namespace() {
        let mut rtnl = Rtnl::open().unwrap();
        let lo = rtnl.link("lo").unwrap().unwrap();
        assert!(lo.up && lo.kind.is_none(), "{lo:?}");
        assert_eq!(rtnl.link("spw-no-such-dev").unwrap(), None);
        let local = rtnl.route(&Lookup { dst: "127.0.0.1".parse().unwrap(), src: None, iif: None, mark: None }).unwrap();
        assert_eq!((local.kind, local.oif), (RTN_LOCAL, Some(lo.ifindex)));
    }
}
