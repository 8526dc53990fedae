//! The parts of a snapshot read from the kernel's socket tables (sock_diag), namespace by
//! namespace: UDP sockets on ephemeral ports (tracepoint and sock_diag modes), TCP ports
//! and CLOSE_WAIT sockets (sock_diag mode), and the inodes of CLOSE_WAIT sockets the
//! tracepoint tracked.
//!
//! Without events, "holds an ephemeral port" is read off the table: a socket counts when
//! its local port lies in its namespace's `ip_local_port_range` and, for TCP, is no
//! listener's port (accepted sockets share the listener's). A port bind() named inside the
//! range counts too: it is taken from the range all the same.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::PortsError;
use super::maps::{CloseWaitRecord, IPPROTO_TCP, IPPROTO_UDP, PortKey};
use super::range::NetnsResolver;
use super::snapshot::Counts;
use super::sockdiag::{DiagSocket, Proto, dump_netns, state};

/// The namespaces a snapshot reads, each with a file to join it by.
pub(super) type Namespaces = Vec<(u32, PathBuf)>;

/// The namespace's sockets; none if it went away since it was listed (its last process
/// exited, its name was deleted), which is normal when reading every namespace.
fn dump(netns: &(u32, PathBuf), proto: Proto, states: u32) -> Result<Vec<DiagSocket>, PortsError> {
    let sockets = dump_netns(&netns.1, proto, states).map_err(|source| PortsError::SockDiag { netns: netns.1.clone(), source })?;
    Ok(sockets.unwrap_or_default())
}

fn key(netns: u32, proto: u8, socket: &DiagSocket) -> PortKey {
    PortKey { netns, rport: socket.rport, proto, family: socket.family, laddr: socket.local, raddr: socket.remote }
}

/// Whether `port` is in namespace `netns`'s ephemeral range (unknown range: no).
fn ephemeral(resolver: &mut NetnsResolver, netns: u32, port: u16) -> bool {
    resolver.ports(netns).is_some_and(|range| (range.low..=range.high).contains(&port))
}

/// UDP sockets on ephemeral ports, per destination (an unconnected socket's is
/// `0.0.0.0:0` or `[::]:0`).
pub(super) fn udp_sums(namespaces: &Namespaces, resolver: &mut NetnsResolver) -> Result<Vec<(PortKey, u64)>, PortsError> {
    let mut sums: HashMap<PortKey, u64> = HashMap::new();
    for netns in namespaces {
        for socket in dump(netns, Proto::Udp, state::ALL)? {
            if socket.lport != 0 && ephemeral(resolver, netns.0, socket.lport) {
                *sums.entry(key(netns.0, IPPROTO_UDP, &socket)).or_default() += 1;
            }
        }
    }
    Ok(sums.into_iter().collect())
}

/// TCP sockets holding an ephemeral port, per destination: TIME_WAIT ones apart, exact
/// (the kernel's table holds them); no event counts (`opened`, `time_wait_total`).
pub(super) fn tcp_counts(namespaces: &Namespaces, resolver: &mut NetnsResolver) -> Result<Vec<(PortKey, Counts)>, PortsError> {
    let mut counts: HashMap<PortKey, Counts> = HashMap::new();
    for netns in namespaces {
        let sockets = dump(netns, Proto::Tcp, state::ALL)?;
        let listening: HashSet<u16> = sockets.iter().filter(|s| s.state == state::LISTEN).map(|s| s.lport).collect();
        for socket in sockets.iter().filter(|s| s.state != state::LISTEN && s.state != state::CLOSE) {
            if listening.contains(&socket.lport) || !ephemeral(resolver, netns.0, socket.lport) {
                continue;
            }
            let entry = counts.entry(key(netns.0, IPPROTO_TCP, socket)).or_default();
            if socket.state == state::TIME_WAIT {
                entry.time_wait += 1;
            } else {
                entry.active += 1;
            }
        }
    }
    Ok(counts.into_iter().collect())
}

/// Sockets in CLOSE_WAIT, aged from when a snapshot first saw them: `first_seen` (by
/// namespace and socket cookie, CLOCK_MONOTONIC seconds) is kept by the caller across
/// snapshots and pruned here to the sockets still there.
pub(super) fn close_wait(
    namespaces: &Namespaces,
    first_seen: &mut HashMap<(u32, u64), u32>,
    now: u32,
) -> Result<Vec<CloseWaitRecord>, PortsError> {
    let mut records = Vec::new();
    let mut present = HashSet::new();
    for netns in namespaces {
        for socket in dump(netns, Proto::Tcp, state::bit(state::CLOSE_WAIT))? {
            let id = (netns.0, socket.cookie);
            present.insert(id);
            let since = *first_seen.entry(id).or_insert(now);
            records.push(record(netns.0, &socket, since));
        }
    }
    first_seen.retain(|id, _| present.contains(id));
    Ok(records)
}

fn record(netns: u32, socket: &DiagSocket, since: u32) -> CloseWaitRecord {
    CloseWaitRecord { key: key(netns, IPPROTO_TCP, socket), lport: socket.lport, pad: 0, since, inode: socket.inode, cgroup: socket.cgroup }
}

/// Fills in the inodes of `records` (tracked by the tracepoint, which cannot read them)
/// from each namespace's CLOSE_WAIT sockets; a record whose socket is gone keeps 0.
pub(super) fn fill_inodes(records: &mut [CloseWaitRecord], resolver: &NetnsResolver) -> Result<(), PortsError> {
    let namespaces: HashSet<u32> = records.iter().map(|r| r.key.netns).collect();
    for netns in namespaces {
        let Some(path) = resolver.path(netns) else { continue };
        let sockets = dump(&(netns, path), Proto::Tcp, state::bit(state::CLOSE_WAIT))?;
        let inodes: HashMap<([u8; 16], u16, [u8; 16], u16), u64> =
            sockets.iter().map(|s| ((s.local, s.lport, s.remote, s.rport), s.inode)).collect();
        for record in records.iter_mut().filter(|r| r.key.netns == netns) {
            let id = (record.key.laddr, record.lport, record.key.raddr, record.key.rport);
            record.inode = inodes.get(&id).copied().unwrap_or(0);
        }
    }
    Ok(())
}

/// Whether sock_diag answers in this process's namespace (the sock_diag mode's one check).
pub(super) fn probe() -> Result<(), PortsError> {
    let own = (0, PathBuf::from("/proc/self/ns/net"));
    dump(&own, Proto::Tcp, state::bit(state::LISTEN)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::AF_INET;

    #[test]
    fn a_namespace_gone_since_it_was_listed_has_no_sockets() {
        let gone = (7, PathBuf::from("/run/netns/spw-no-such-namespace"));
        assert_eq!(dump(&gone, Proto::Tcp, state::ALL).unwrap(), []);
    }

    #[test]
    fn records_carry_the_connection_and_keys_map_ipv4() {
        let mut local = [0u8; 16];
        local[10] = 0xff;
        local[11] = 0xff;
        local[12..].copy_from_slice(&[10, 0, 0, 1]);
        let socket = DiagSocket {
            family: AF_INET,
            state: state::CLOSE_WAIT,
            local,
            lport: 80,
            remote: local,
            rport: 40000,
            inode: 77,
            cookie: 5,
            cgroup: 9,
        };
        let record = record(3, &socket, 100);
        assert_eq!(
            (record.key.netns, record.key.rport, record.lport, record.since, record.inode, record.cgroup),
            (3, 40000, 80, 100, 77, 9)
        );
        assert_eq!(record.key.local().to_string(), "10.0.0.1");
    }
}
