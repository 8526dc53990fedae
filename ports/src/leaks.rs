//! CLOSE_WAIT leak suspects: sockets whose peer closed long ago but whose application never
//! closed them. The kernel side keeps only "since when" per socket; the owning processes
//! are looked up in /proc (`socket:[inode]` links) only for sockets past the threshold, so
//! nothing scans /proc while there is no suspect.

use std::collections::{BTreeSet, HashMap, HashSet};

use spillway_model::ports_report::LeakSuspect;

use super::maps::CloseWaitRecord;

/// Local ports listed per suspect, at most.
const MAX_PORTS_LISTED: usize = 16;

/// A process holding a socket open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
}

/// Groups the sockets in CLOSE_WAIT for at least `after_secs` at monotonic second `now` by
/// holding process; `owners` maps socket inodes to their holders (called only when some
/// socket is that old). Most sockets first.
pub fn leak_suspects(
    records: &[CloseWaitRecord],
    now: u32,
    after_secs: u64,
    owners: impl FnOnce(&HashSet<u64>) -> HashMap<u64, Vec<Holder>>,
) -> Vec<LeakSuspect> {
    let age = |r: &CloseWaitRecord| u64::from(now.saturating_sub(r.since));
    let old: Vec<&CloseWaitRecord> = records.iter().filter(|r| age(r) >= after_secs).collect();
    if old.is_empty() {
        return Vec::new();
    }
    let inodes: HashSet<u64> = old.iter().map(|r| r.inode).filter(|&i| i != 0).collect();
    let owners = owners(&inodes);
    let mut groups: HashMap<(u32, Option<u32>), (LeakSuspect, BTreeSet<u16>)> = HashMap::new();
    for record in old {
        let holders: Vec<Option<&Holder>> = match owners.get(&record.inode) {
            Some(holders) if !holders.is_empty() => holders.iter().map(Some).collect(),
            _ => vec![None],
        };
        for holder in holders {
            let (suspect, ports) = groups.entry((record.key.netns, holder.map(|h| h.pid))).or_insert_with(|| {
                let suspect = LeakSuspect {
                    netns: record.key.netns,
                    pid: holder.map(|h| h.pid),
                    comm: holder.map(|h| h.comm.clone()),
                    cgroup_id: record.cgroup,
                    count: 0,
                    oldest_age_secs: 0,
                    local_ports: Vec::new(),
                };
                (suspect, BTreeSet::new())
            });
            suspect.count += 1;
            if age(record) > suspect.oldest_age_secs {
                suspect.oldest_age_secs = age(record);
                suspect.cgroup_id = record.cgroup;
            }
            ports.insert(record.lport);
        }
    }
    let mut suspects: Vec<LeakSuspect> = groups
        .into_values()
        .map(|(mut suspect, ports)| {
            suspect.local_ports = ports.into_iter().take(MAX_PORTS_LISTED).collect();
            suspect
        })
        .collect();
    suspects.sort_by(|a, b| b.count.cmp(&a.count).then(b.oldest_age_secs.cmp(&a.oldest_age_secs)).then(a.pid.cmp(&b.pid)));
    suspects
}

/// The processes holding each of `inodes` open, found through /proc/<pid>/fd (every
/// process's descriptors: the caller keeps this for when there is a suspect).
pub fn socket_owners(inodes: &HashSet<u64>) -> HashMap<u64, Vec<Holder>> {
    let mut owners: HashMap<u64, Vec<Holder>> = HashMap::new();
    if inodes.is_empty() {
        return owners;
    }
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids {
        // Processes exit and close descriptors while we look: skip what is gone.
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        let mut comm = None;
        for fd in fds.flatten() {
            let Some(inode) = std::fs::read_link(fd.path()).ok().and_then(|t| socket_inode(t.to_str()?)) else { continue };
            if !inodes.contains(&inode) {
                continue;
            }
            let holders = owners.entry(inode).or_default();
            // The same socket in two descriptors (dup) is still one holder.
            if holders.last().is_some_and(|h| h.pid == pid) {
                continue;
            }
            let comm =
                comm.get_or_insert_with(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_owned());
            holders.push(Holder { pid, comm: comm.clone() });
        }
    }
    owners
}

/// `socket:[12345]` → 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PortKey;

    fn record(netns: u32, lport: u16, since: u32, inode: u64) -> CloseWaitRecord {
        let key = PortKey::tcp(netns, "10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), 40000);
        CloseWaitRecord { key, lport, since, inode, cgroup: u64::from(since), ..CloseWaitRecord::default() }
    }

    #[test]
    fn groups_old_sockets_by_holder_and_skips_young_ones() {
        let records = [
            record(1, 80, 100, 11),
            record(1, 80, 90, 12),
            record(1, 443, 95, 13),
            record(1, 80, 129, 14), // 1 s old: not yet a suspect
            record(2, 80, 100, 21), // another namespace, same process
            record(1, 8080, 50, 0), // never accepted
            record(1, 80, 100, 99), // its holder exited
        ];
        let mut asked = HashSet::new();
        let suspects = leak_suspects(&records, 130, 30, |inodes| {
            asked = inodes.clone();
            let holder = |pid, comm: &str| vec![Holder { pid, comm: comm.into() }];
            HashMap::from([(11, holder(7, "leaky")), (12, holder(7, "leaky")), (13, holder(7, "leaky")), (21, holder(7, "leaky"))])
        });
        assert_eq!(asked, HashSet::from([11, 12, 13, 21, 99]), "only old sockets with a file are looked up");
        let got: Vec<_> = suspects.iter().map(|s| (s.netns, s.pid, s.count, s.oldest_age_secs, s.local_ports.clone())).collect();
        assert_eq!(got, [(1, Some(7), 3, 40, vec![80, 443]), (1, None, 2, 80, vec![80, 8080]), (2, Some(7), 1, 30, vec![80])]);
        assert_eq!(suspects[0].comm.as_deref(), Some("leaky"));
        assert_eq!(suspects[0].cgroup_id, 90, "the oldest socket's cgroup");

        let mut looked_up = false;
        assert!(
            leak_suspects(&records[3..4], 130, 30, |_| {
                looked_up = true;
                HashMap::new()
            })
            .is_empty()
        );
        assert!(!looked_up, "no /proc scan without a suspect");
    }

    #[test]
    fn finds_this_process_holding_its_socket() {
        use std::os::unix::fs::MetadataExt;
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&socket))).unwrap().ino();
        let owners = socket_owners(&HashSet::from([inode]));
        let holders = &owners[&inode];
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0].pid, std::process::id());
        assert_eq!(socket_inode("socket:[42]"), Some(42));
        assert_eq!(socket_inode("pipe:[42]"), None);
    }
}
