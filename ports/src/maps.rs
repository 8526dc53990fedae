//! The sockwatch maps' keys and values; `#[repr(C)]` mirrors of the structs in
//! `sockwatch-ebpf/sockwatch.bpf.c` (sizes asserted below).

use std::net::{IpAddr, Ipv6Addr};

/// One destination seen from one network namespace (`struct port_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortKey {
    /// Inode of the socket's network namespace (as `stat /run/netns/<name>` shows).
    pub netns: u32,
    /// Remote port, host byte order.
    pub rport: u16,
    pub proto: u8,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// IPv6, or IPv4-mapped (`::ffff:a.b.c.d`) for IPv4.
    pub laddr: [u8; 16],
    pub raddr: [u8; 16],
}

/// One-second TIME_WAIT buckets per destination (`TW_BUCKETS`).
pub const TW_BUCKETS: usize = 64;
/// Linux's `TCP_TIMEWAIT_LEN`: a timewait sock holds its port this long (seconds) unless
/// reused or reset earlier.
pub const TIMEWAIT_LEN_SECS: u32 = 60;

/// Running counts for one destination (`struct port_counts`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortCounts {
    /// Full sockets between `SYN_SENT` and `CLOSE`.
    pub active: i64,
    /// Timewait socks created since the watcher was loaded.
    pub time_wait_total: u64,
    /// Calls that found no free port: TCP `connect()` (`EADDRNOTAVAIL`), `bind()` to port 0
    /// (`EADDRINUSE`), UDP `connect()` autobind (`EAGAIN`).
    pub failures: u64,
    /// Active opens seen since the watcher was loaded.
    pub opened: u64,
    /// Timewait socks created in second `tw_sec[i]` (CLOCK_MONOTONIC), `i = sec % 64`.
    pub tw_sec: [u32; TW_BUCKETS],
    pub tw_count: [u32; TW_BUCKETS],
}

impl Default for PortCounts {
    fn default() -> Self {
        PortCounts { active: 0, time_wait_total: 0, failures: 0, opened: 0, tw_sec: [0; TW_BUCKETS], tw_count: [0; TW_BUCKETS] }
    }
}

impl PortCounts {
    /// TIME_WAIT sockets still holding a port at monotonic second `now`: those created in
    /// the last [`TIMEWAIT_LEN_SECS`] (inclusive, so an estimate errs high by at most a
    /// second's worth; sockets reused or reset early are still counted).
    pub fn time_wait_at(&self, now: u32) -> u64 {
        self.tw_sec
            .iter()
            .zip(self.tw_count)
            .filter(|&(&sec, count)| count > 0 && now.wrapping_sub(sec) <= TIMEWAIT_LEN_SECS)
            .map(|(_, count)| u64::from(count))
            .sum()
    }
}

/// The current CLOCK_MONOTONIC second, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_secs() -> u32 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u32
}

/// One process's calls that failed for want of a port, per destination, call and errno
/// (`struct fail_key`). For `bind()`, the local address is the one asked for and the remote
/// is unspecified; for a UDP `connect()`, the remote is the one
/// asked for and the local unspecified (the socket had no port).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailKey {
    pub key: PortKey,
    pub tgid: u32,
    /// [`CALL_CONNECT`] or [`CALL_BIND`].
    pub call: u16,
    /// The (positive) errno the call returned.
    pub err: u16,
    pub cgroup: u64,
    pub comm: [u8; 16],
}

/// One socket in CLOSE_WAIT, as the close-wait iterator writes it (`struct close_wait_rec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CloseWaitRecord {
    /// The connection; `raddr`/`rport` is the peer that closed.
    pub key: PortKey,
    pub lport: u16,
    pub pad: u16,
    /// CLOCK_MONOTONIC second the socket entered CLOSE_WAIT (see [`monotonic_secs`]).
    pub since: u32,
    /// Inode of the socket's file (`socket:[inode]` in /proc/<pid>/fd); 0 while the
    /// socket is still in a listener's accept queue.
    pub inode: u64,
    /// cgroup2 id of the socket (an accepted socket inherits its listener's).
    pub cgroup: u64,
}

/// `sw_close_wait`'s value (`struct close_wait_val`): what the kernel side knew when the
/// socket entered CLOSE_WAIT. Read directly where map iterators are refused.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloseWaitValue {
    pub key: PortKey,
    pub lport: u16,
    pub pad: u16,
    pub since: u32,
    pub cgroup: u64,
}

impl CloseWaitValue {
    /// The record, with the socket's inode found elsewhere (0: unknown).
    pub fn record(&self, inode: u64) -> CloseWaitRecord {
        let CloseWaitValue { key, lport, pad: _, since, cgroup } = *self;
        CloseWaitRecord { key, lport, pad: 0, since, inode, cgroup }
    }
}

impl CloseWaitRecord {
    /// Parses the iterator's output: whole records, native byte order.
    pub fn parse_all(bytes: &[u8]) -> Vec<CloseWaitRecord> {
        const LEN: usize = size_of::<CloseWaitRecord>();
        bytes.as_chunks::<LEN>().0.iter().map(|record| bytemuck::pod_read_unaligned(record)).collect()
    }
}

const _: () = assert!(size_of::<PortKey>() == 40);
const _: () = assert!(size_of::<PortCounts>() == 32 + 8 * TW_BUCKETS);
const _: () = assert!(size_of::<FailKey>() == 72);
const _: () = assert!(size_of::<CloseWaitRecord>() == 64);
const _: () = assert!(size_of::<CloseWaitValue>() == 56);

// SAFETY: plain old data: no padding (asserted sizes equal the sum of the fields), any bit
// pattern is valid.
unsafe impl aya::Pod for PortKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PortCounts {}
// SAFETY: as above (`pad` makes the padding explicit).
unsafe impl aya::Pod for FailKey {}
// SAFETY: as above.
unsafe impl aya::Pod for CloseWaitValue {}

/// Names of the `sw_stats` array's counters, by index: events the kernel side could not
/// record because a map was full.
pub const STAT_NAMES: [&str; 7] = [
    "sock_table_full",
    "key_table_full",
    "fail_table_full",
    "close_wait_table_full",
    "udp_sock_table_full",
    "udp_key_table_full",
    "pending_table_full",
];
/// `udp_key_table_full` counts per UDP sum (one read), not since load: userspace zeroes it.
pub(crate) const STAT_UDP_KEY_TABLE_FULL: u32 = 5;

pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;

/// [`FailKey::call`]: `connect()` (TCP, `EADDRNOTAVAIL`; or UDP autobind, `EAGAIN`).
pub const CALL_CONNECT: u16 = 0;
/// [`FailKey::call`]: `bind()` to port 0 (`EADDRINUSE`).
pub const CALL_BIND: u16 = 1;

impl PortKey {
    pub fn local(&self) -> IpAddr {
        addr(self.family, self.laddr)
    }

    pub fn remote(&self) -> IpAddr {
        addr(self.family, self.raddr)
    }

    pub fn protocol(&self) -> &'static str {
        match self.proto {
            IPPROTO_TCP => "tcp",
            IPPROTO_UDP => "udp",
            _ => "other",
        }
    }

    /// A key for `local → remote:rport` over TCP in namespace `netns` (tests, lookups).
    pub fn tcp(netns: u32, local: IpAddr, remote: IpAddr, rport: u16) -> PortKey {
        PortKey::new(IPPROTO_TCP, netns, local, remote, rport)
    }

    /// As [`PortKey::tcp`], for UDP (an unconnected socket has remote `0.0.0.0:0`).
    pub fn udp(netns: u32, local: IpAddr, remote: IpAddr, rport: u16) -> PortKey {
        PortKey::new(IPPROTO_UDP, netns, local, remote, rport)
    }

    fn new(proto: u8, netns: u32, local: IpAddr, remote: IpAddr, rport: u16) -> PortKey {
        let family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
        PortKey { netns, rport, proto, family, laddr: octets(local), raddr: octets(remote) }
    }
}

fn addr(family: u8, bytes: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(bytes);
    match (family, v6.to_ipv4_mapped()) {
        (AF_INET, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v6),
    }
}

fn octets(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl FailKey {
    /// The failed call's name: `connect` or `bind`.
    pub fn call_name(&self) -> &'static str {
        match self.call {
            CALL_CONNECT => "connect",
            CALL_BIND => "bind",
            _ => "other",
        }
    }

    /// The errno's name (`EADDRNOTAVAIL`, `EADDRINUSE`, `EAGAIN`), else its number.
    pub fn errno_name(&self) -> String {
        match i32::from(self.err) {
            libc::EADDRNOTAVAIL => "EADDRNOTAVAIL".into(),
            libc::EADDRINUSE => "EADDRINUSE".into(),
            libc::EAGAIN => "EAGAIN".into(),
            n => n.to_string(),
        }
    }

    /// The process name, up to its first NUL.
    pub fn comm(&self) -> String {
        let end = self.comm.iter().position(|&b| b == 0).unwrap_or(self.comm.len());
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_keys_round_trip_through_mapped_addresses() {
        let key = PortKey::tcp(7, "10.0.0.11".parse().unwrap(), "10.0.0.101".parse().unwrap(), 80);
        assert_eq!(key.local().to_string(), "10.0.0.11");
        assert_eq!(key.remote().to_string(), "10.0.0.101");
        assert_eq!(key.laddr[10..12], [0xff, 0xff]);
        let key6 = PortKey::tcp(7, "fd00::11".parse().unwrap(), "fd00::101".parse().unwrap(), 80);
        assert_eq!(key6.remote().to_string(), "fd00::101");
        assert_eq!(key6.protocol(), "tcp");
    }

    #[test]
    fn time_wait_counts_the_last_sixty_seconds() {
        let mut counts = PortCounts::default();
        for (sec, n) in [(1000u32, 5u32), (1030, 7), (1060, 11), (939, 100)] {
            let i = sec as usize % TW_BUCKETS;
            counts.tw_sec[i] = sec;
            counts.tw_count[i] = n;
        }
        assert_eq!(counts.time_wait_at(1060), 5 + 7 + 11);
        assert_eq!(counts.time_wait_at(1061), 7 + 11);
        assert_eq!(counts.time_wait_at(1121), 0);
        assert_eq!(PortCounts::default().time_wait_at(30), 0, "empty buckets count nothing");
    }
}
