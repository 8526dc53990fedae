//! A reference model of the balancer's decision: for a frame and the maps' contents, the
//! action, the [`Reason`] counted, the backend and the bytes that leave, predicted from the
//! path's specification (ARCHITECTURE.md, "the data path"; the operator guide's limits and
//! connection table), never by calling the program's code. Only `spillway-common`'s shared
//! math (hashes, Maglev slots, prefixes, the map types) is common to both.
//!
//! `daemon/tests/datapath/differential/` runs generated frames and map states through the
//! real program and this model and fails on any difference. What the model does not cover it
//! refuses with a [`ModelError`] rather than guess: encrypted QUIC-LB ids, `--pass-to`, and a
//! connection table that would have to evict a flow to make room.

mod echo;
mod encap;
pub mod frame;
mod limits;
mod ptb;
mod quic;
mod routes;
mod state;
mod table;

use std::collections::HashMap;

use spillway_common::{
    hash::{flow_hash, maglev_hash},
    limits::{FRAGMENT_RECORD_TICKS, FRAGMENT_SOURCE_BURST, FRAGMENT_SOURCE_PER_S, FRAGMENT_SOURCE_PREFIX_V6},
    prefix::masked,
    types::{
        ADDR_F_ECHO, BACKEND_ACTIVE, BackendInfo, CFG_F_PASS_TO, CFG_F_STATIC_NEXTHOP, ENCAP_GUE, FAMILY_V4, FlowKey, PROTO_TCP, PROTO_UDP,
        Rate, Reason, VipKey,
    },
};

pub use routes::{Link, Routes};
pub use state::{MapState, VipEntry};

use frame::{Datagram, Dst, ETH_LEN, Fragment, Layout, Parsed};
use table::{Remembered, Table, ticks};

/// An XDP action, numbered as the kernel numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Drop = 1,
    Pass = 2,
    Tx = 3,
    Redirect = 4,
}

/// What the balancer does with one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prediction {
    pub action: Action,
    pub reason: Reason,
    /// The backend id the packet was sent to.
    pub backend: Option<u32>,
    /// The frame as it leaves (or stays, for a pass or a drop).
    pub frame: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("the model does not cover {0}")]
    Unmodelled(&'static str),
    #[error("the connection table's buckets {buckets:?} are full: which flow the program evicts is not modelled")]
    TableCrowded { buckets: (u32, u32) },
}

const FRAGMENT_RATE: Rate = Rate::new(FRAGMENT_SOURCE_PER_S, FRAGMENT_SOURCE_BURST);

/// The backend id in the slot of Maglev hash `maglev` of `table`.
fn slot(table: &[u32], maglev: u32) -> Option<&u32> {
    table.get(maglev as usize % table.len().max(1))
}

/// Where a first fragment's datagram went.
#[derive(Clone, Copy)]
struct FragmentRecord {
    backend_id: u32,
    generation: u32,
    flow_hash: u32,
    placed: u32,
}

/// The model: the maps' contents, the clock, and the state the program keeps itself.
pub struct Model {
    state: MapState,
    now_ns: u64,
    table: Table,
    buckets: limits::Buckets,
    echo: echo::Buckets,
    ptb: ptb::Buckets,
    fragment_sources: HashMap<(u8, [u32; 4]), u64>,
    fragments: HashMap<Datagram, FragmentRecord>,
}

/// How the path places a packet: as its own flow, or as a datagram's first fragment.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    Packet,
    FirstFragment { id: u32 },
}

/// A verdict before the output frame is known.
struct Verdict {
    action: Action,
    reason: Reason,
    backend: Option<u32>,
    out: Output,
}

/// The frame that leaves (or stays).
enum Output {
    Unchanged,
    /// Headers that replace the frame's first `l2_len` bytes (an encapsulated packet).
    Encapsulated {
        headers: Vec<u8>,
        l2_len: usize,
    },
    /// Rewritten in place (an echo answer).
    Rewritten(Vec<u8>),
}

impl Verdict {
    fn ended(action: Action, reason: Reason) -> Verdict {
        Verdict { action, reason, backend: None, out: Output::Unchanged }
    }
}

impl Model {
    pub fn new(state: MapState, now_ns: u64) -> Model {
        Model {
            state,
            now_ns,
            table: Table::default(),
            buckets: limits::Buckets::default(),
            echo: echo::Buckets::default(),
            ptb: ptb::Buckets::default(),
            fragment_sources: HashMap::new(),
            fragments: HashMap::new(),
        }
    }

    /// New map contents (the state the program keeps itself stays).
    pub fn set_state(&mut self, state: MapState) {
        self.state = state;
    }

    /// The program's clock (frozen between calls).
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// What the balancer does with `frame`, arriving on the state's ingress interface.
    pub fn run(&mut self, frame: &[u8]) -> Result<Prediction, ModelError> {
        let verdict = match frame::parse(frame) {
            Parsed::Fragment(_) => self.fragment(frame)?,
            parsed => self.place(frame, parsed, Placement::Packet)?,
        };
        let out = match verdict.out {
            Output::Encapsulated { mut headers, l2_len } => {
                headers.extend_from_slice(&frame[l2_len..]);
                headers
            }
            Output::Rewritten(out) => out,
            Output::Unchanged => frame.to_vec(),
        };
        Ok(Prediction { action: verdict.action, reason: verdict.reason, backend: verdict.backend, frame: out })
    }

    /// Not ours: passed (the operator's program, if any, is not modelled).
    fn passed(&self, reason: Reason) -> Result<Verdict, ModelError> {
        if self.state.config.flags & CFG_F_PASS_TO != 0 {
            return Err(ModelError::Unmodelled("--pass-to"));
        }
        Ok(Verdict::ended(Action::Pass, reason))
    }

    /// No VIP serves the packet: dropped if its address is a VIP's, else not ours.
    fn not_served(&self, dst: &Dst, reason: Reason) -> Result<Verdict, ModelError> {
        if self.state.address_flags(dst) != 0 {
            return Ok(Verdict::ended(Action::Drop, reason));
        }
        self.passed(Reason::PassNotVip)
    }

    /// Another protocol than TCP or UDP to `dst`: an echo request to an address that
    /// answers is answered; the rest is not served.
    fn other(&mut self, frame: &[u8], dst: &Dst) -> Result<Verdict, ModelError> {
        if self.state.address_flags(dst) & ADDR_F_ECHO == 0 {
            return self.not_served(dst, Reason::DropNoService);
        }
        Ok(match self.echo.answer(frame, &self.state.echo, self.now_ns) {
            Ok(answer) => Verdict { out: Output::Rewritten(answer), ..Verdict::ended(Action::Tx, Reason::TxEchoReply) },
            Err(reason) => Verdict::ended(Action::Drop, reason),
        })
    }

    fn place(&mut self, frame: &[u8], parsed: Parsed, placement: Placement) -> Result<Verdict, ModelError> {
        let unserved = if placement == Placement::Packet { Reason::DropNoService } else { Reason::DropFragment };
        let (key, layout, icmp_error, syn) = match parsed {
            Parsed::NotIp => return self.passed(Reason::PassNotIp),
            Parsed::Malformed => return self.passed(Reason::PassMalformed),
            Parsed::Other(dst) => return self.other(frame, &dst),
            Parsed::Fragment(dst) => return self.not_served(&dst, Reason::DropFragment),
            Parsed::Flow { key, layout, icmp_error, syn } => (key, layout, icmp_error, syn),
        };
        let Some(vip) = self.state.vip(&VipKey { addr: key.dst, port: key.dport, proto: key.proto, family: key.family }).cloned() else {
            return self.not_served(&Dst { addr: key.dst, family: key.family }, unserved);
        };
        // Only a packet of the path itself (not a first fragment) is looked at as QUIC.
        if let (Some(quic), Placement::Packet, false) = (&vip.quic, placement, icmp_error)
            && let Some((id, backend, hash)) = quic::named(&self.state, frame, vip.id, quic, layout.l4)?
        {
            return self.forward(frame, key.family, &layout, (id, &backend), None, hash);
        }
        let now_ns = self.now_ns;
        let now = ticks(now_ns);
        let refused = |reason| Verdict::ended(Action::Drop, reason);
        if placement != Placement::Packet && !self.admit_fragment(&key, now_ns) {
            return Ok(refused(Reason::DropFragmentLimited));
        }
        let cfg = self.state.config;
        let hash = flow_hash(&key, cfg.table_seed);
        // A SYN is a new connection even on a known tuple; only a packet of the flow itself
        // (not an ICMP error about it) refreshes its entry.
        let known = if syn { None } else { self.table.established(&self.state, &key, vip.id, now, !icmp_error) };
        let (id, backend) = match known {
            Some(found) => found,
            None => {
                // Neither a TCP packet past the handshake nor an ICMP error is a new flow.
                let midstream = !syn && key.proto == PROTO_TCP;
                if let Err(reason) = self.buckets.admit(&self.state, &key, vip.id, now_ns, !midstream && !icmp_error) {
                    return Ok(refused(reason));
                }
                let maglev = maglev_hash(&key, vip.flags, cfg.flow_seed);
                // A connection that began elsewhere, after the VIP's last change moved its
                // slot: the backend of the slot now, with the one before inside (second chance).
                if midstream
                    && !icmp_error
                    && let Some((first, second)) = self.second_chance(&vip, maglev)
                {
                    return self.forward(frame, key.family, &layout, (first.0, &first.1), Some(&second), hash);
                }
                let Some(&id) = slot(&vip.ring, maglev) else {
                    return Ok(refused(Reason::DropNoBackend));
                };
                let Some(backend) = self.state.backends.get(&id).filter(|b| b.state == BACKEND_ACTIVE).copied() else {
                    return Ok(refused(Reason::DropNoBackend));
                };
                if icmp_error {
                    (id, backend)
                } else {
                    match self.table.remember(&self.state, &key, vip.id, hash, (id, &backend), now)? {
                        Remembered::Placed => (id, backend),
                        Remembered::Kept(kept, b) => (kept, b),
                    }
                }
            }
        };
        if let Placement::FirstFragment { id: datagram_id } = placement {
            let datagram = Datagram { src: key.src, dst: Dst { addr: key.dst, family: key.family }, id: datagram_id, proto: key.proto };
            let record = FragmentRecord { backend_id: id, generation: backend.generation, flow_hash: hash, placed: now };
            self.fragments.insert(datagram, record);
        }
        self.forward(frame, key.family, &layout, (id, &backend), None, hash)
    }

    /// The backends of the flow's slot in the VIP's table and in its table before the last
    /// change, if they differ and both are in use (the earlier one by this VIP still).
    fn second_chance(&self, vip: &VipEntry, maglev: u32) -> Option<((u32, BackendInfo), BackendInfo)> {
        let (&first, &second) = (slot(&vip.ring, maglev)?, slot(&vip.prior, maglev)?);
        let active = |id| self.state.backends.get(&id).filter(|b| b.state == BACKEND_ACTIVE).copied();
        let (now, before) = (active(first)?, active(second).filter(|b| b.vip_id == vip.id)?);
        (first != second).then_some(((first, now), before))
    }

    /// The fragment program (`spillway_lb_frag`): a UDP datagram's first fragment is placed
    /// as its flow and recorded; later ones follow the record.
    fn fragment(&mut self, frame: &[u8]) -> Result<Verdict, ModelError> {
        match frame::parse_fragment(frame) {
            Fragment::Malformed => Ok(Verdict::ended(Action::Pass, Reason::PassMalformed)),
            Fragment::Unplaceable(dst) => self.not_served(&dst, Reason::DropFragment),
            Fragment::First { datagram, .. } | Fragment::Later { datagram, .. } if datagram.proto != PROTO_UDP => {
                self.not_served(&datagram.dst, Reason::DropFragment)
            }
            Fragment::First { key, datagram, layout } => {
                let parsed = Parsed::Flow { key, layout, icmp_error: false, syn: false };
                self.place(frame, parsed, Placement::FirstFragment { id: datagram.id })
            }
            Fragment::Later { datagram, layout } => self.follow(frame, &datagram, &layout),
        }
    }

    fn admit_fragment(&mut self, key: &FlowKey, now_ns: u64) -> bool {
        let prefix = if key.family == FAMILY_V4 { 32 } else { FRAGMENT_SOURCE_PREFIX_V6 };
        limits::gcra(self.fragment_sources.entry((key.family, masked(&key.src, prefix))).or_default(), &FRAGMENT_RATE, now_ns)
    }

    fn follow(&mut self, frame: &[u8], datagram: &Datagram, layout: &Layout) -> Result<Verdict, ModelError> {
        if self.state.address_flags(&datagram.dst) == 0 {
            return Ok(Verdict::ended(Action::Pass, Reason::PassNotVip));
        }
        let unmatched = Verdict::ended(Action::Drop, Reason::DropFragmentUnmatched);
        let Some(record) = self.fragments.get(datagram).copied() else {
            return Ok(unmatched);
        };
        if ticks(self.now_ns).wrapping_sub(record.placed) & !spillway_common::types::FLOW_CONFIRMED > FRAGMENT_RECORD_TICKS {
            return Ok(unmatched);
        }
        let Some(backend) =
            self.state.backends.get(&record.backend_id).filter(|b| b.state == BACKEND_ACTIVE && b.generation == record.generation).copied()
        else {
            return Ok(unmatched);
        };
        self.forward(frame, datagram.dst.family, layout, (record.backend_id, &backend), None, record.flow_hash)
    }

    /// A packet too big once encapsulated: answered with the `mtu` that fits, if it may be.
    fn too_big(&mut self, frame: &[u8], mtu: usize) -> Verdict {
        let Parsed::Flow { key, layout, icmp_error: false, .. } = frame::parse(frame) else {
            return Verdict::ended(Action::Drop, Reason::DropOversize);
        };
        match self.ptb.answer(frame, &key, &layout, mtu, self.now_ns) {
            Ok(answer) => Verdict { out: Output::Rewritten(answer), ..Verdict::ended(Action::Tx, Reason::TxPacketTooBig) },
            Err(reason) => Verdict::ended(Action::Drop, reason),
        }
    }

    /// Encapsulates towards backend `id` (around a tunnel to `second`, if given) and sends
    /// on the static next hop, or the one the routes give.
    fn forward(
        &mut self,
        frame: &[u8],
        family: u8,
        layout: &Layout,
        (id, backend): (u32, &BackendInfo),
        second: Option<&BackendInfo>,
        hash: u32,
    ) -> Result<Verdict, ModelError> {
        let cfg = &self.state.config;
        let inner_family = second.map_or(family, |s| s.family);
        if !encap::supported(backend.family, inner_family) || !encap::supported(inner_family, family) {
            return Ok(Verdict::ended(Action::Drop, Reason::DropEncapFailed));
        }
        let tunnel = |to: &BackendInfo, inner_family, inner_len| encap::Tunnel {
            backend: *to,
            src: cfg.outer_source(to.family, hash),
            inner_family,
            inner_len,
            tos: layout.tos,
            flow_hash: hash,
            gue_port: if to.encap == ENCAP_GUE { cfg.gue_port } else { 0 },
        };
        let headers = |macs: ([u8; 6], [u8; 6])| match second {
            None => encap::headers(&tunnel(backend, family, layout.l3_len), macs.0, macs.1),
            Some(s) => {
                let middle = encap::headers(&tunnel(s, family, layout.l3_len), macs.0, macs.1);
                let middle_ip = &middle[ETH_LEN..];
                let mut out = encap::headers(&tunnel(backend, s.family, layout.l3_len + middle_ip.len()), macs.0, macs.1);
                out.extend_from_slice(middle_ip);
                out
            }
        };
        let sent = |action, reason, macs| Verdict {
            action,
            reason,
            backend: Some(id),
            out: Output::Encapsulated { headers: headers(macs), l2_len: layout.l2_len },
        };
        // The kernel forwards what the path cannot send itself: with the MACs it came with.
        let arrived = (frame[6..12].try_into().unwrap_or_default(), frame[..6].try_into().unwrap_or_default());
        let (egress, macs) = if cfg.flags & CFG_F_STATIC_NEXTHOP != 0 {
            (cfg.static_ifindex, (cfg.static_src_mac, cfg.static_dst_mac))
        } else {
            let overhead = headers(arrived).len() - ETH_LEN;
            match self.state.routes.next_hop(&backend.addr, backend.family, overhead + layout.l3_len) {
                routes::NextHop::Resolved { ifindex, macs } => (ifindex, macs),
                routes::NextHop::NoNeigh => return Ok(sent(Action::Pass, Reason::KernelNoNeigh, arrived)),
                routes::NextHop::NoRoute => return Ok(Verdict::ended(Action::Drop, Reason::DropNoRoute)),
                routes::NextHop::FragNeeded { mtu } => return Ok(self.too_big(frame, mtu.saturating_sub(overhead))),
            }
        };
        Ok(if egress == self.state.ingress {
            sent(Action::Tx, Reason::Tx, macs)
        } else if self.state.tx_ports.contains(&egress) {
            sent(Action::Redirect, Reason::Redirect, macs)
        } else {
            sent(Action::Pass, Reason::KernelNoTxPort, arrived)
        })
    }
}

#[cfg(test)]
mod tests;
