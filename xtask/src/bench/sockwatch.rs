//! The socket watcher's overhead (`spillway::ports`): program run times from the kernel's
//! run-time statistics, and what they add to real socket operations over loopback.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use spillway::ports::{PROGRAMS, PortKey, ProgramStats, SockWatch, netns_inode};

use super::{Section, median};

/// The part: figures for `reps` repetitions.
pub fn part(reps: usize) -> Result<Section> {
    let cost = sockwatch_overhead(reps)?;
    Ok(Section { text: render(&cost, reps)?, rows: cost.json_rows() })
}

/// TCP connect+close cycles and UDP sockets per repetition, each repetition in a fresh
/// network namespace (so its TIME_WAIT sockets never run the port range out).
const SOCKWATCH_TCP_CYCLES: usize = 2000;
const SOCKWATCH_UDP_SOCKETS: usize = 2000;
/// Datagrams sent from a bound UDP socket per repetition, half with sendto(), half with
/// sendmsg(): the watcher must add nothing per datagram (it does not follow sends).
const SOCKWATCH_UDP_SENDS: usize = 2000;
/// Sockets open during the timed reads: connected UDP sockets, and server sockets left in
/// CLOSE_WAIT (what the two iterators walk).
const SOCKWATCH_READ_UDP: usize = 1000;
const SOCKWATCH_READ_CLOSE_WAIT: usize = 200;
const SOCKWATCH_READS: usize = 20;

/// One repetition's figures, or their medians, in ns.
struct SockwatchCost {
    /// Per program: run time per run.
    per_run: Vec<(&'static str, f64)>,
    /// One connect+close cycle (both ends, loopback), wall time, without and with the watcher.
    tcp_cycle: f64,
    tcp_cycle_watched: f64,
    /// The watcher's programs' run time per cycle.
    tcp_cycle_bpf: f64,
    /// One UDP socket bound to port 0 and closed, wall time without the watcher, and the
    /// programs' run time per socket.
    udp_socket: f64,
    udp_socket_bpf: f64,
    /// One datagram sent from a bound socket: wall time without the watcher, and the
    /// programs' run time per datagram.
    udp_send: f64,
    udp_send_bpf: f64,
    /// One snapshot (maps read, both iterators run) with the read sockets open.
    read: f64,
}

impl SockwatchCost {
    /// The rows of the JSON output: every figure in ns.
    fn json_rows(&self) -> Vec<(String, f64)> {
        let programs = self.per_run.iter().map(|(name, ns)| (format!("{name}_per_run"), *ns));
        let cycles = [
            ("tcp_cycle", self.tcp_cycle),
            ("tcp_cycle_with_sockwatch", self.tcp_cycle_watched),
            ("sockwatch_per_tcp_cycle", self.tcp_cycle_bpf),
            ("udp_socket", self.udp_socket),
            ("sockwatch_per_udp_socket", self.udp_socket_bpf),
            ("udp_send", self.udp_send),
            ("sockwatch_per_udp_send", self.udp_send_bpf),
            ("sockwatch_read", self.read),
        ];
        programs.chain(cycles.into_iter().map(|(k, v)| (k.to_owned(), v))).collect()
    }
}

/// Loads the watcher and drives real sockets over loopback: ns per program run from the
/// kernel's run-time statistics (BPF_ENABLE_STATS: on while the returned descriptor is
/// open, so it is back off however this ends), and the cost per connect+close cycle against
/// the same cycles without the watcher, alternating repetitions.
fn sockwatch_overhead(reps: usize) -> Result<SockwatchCost> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enabling BPF run-time statistics")?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (tcp_cycle, udp_socket, udp_send) = in_scratch_netns(|| Ok((time_tcp_cycles()?, time_udp_sockets()?, time_udp_sends()?)))?;
        let (tcp_cycle_watched, read, [start, after_tcp, after_udp, after_sends, end]) = in_scratch_netns(|| {
            let mut watch = SockWatch::load().context("loading sockwatch")?;
            let start = watch.program_stats()?;
            let tcp_ns = time_tcp_cycles()?;
            let after_tcp = watch.program_stats()?;
            time_udp_sockets()?;
            let after_udp = watch.program_stats()?;
            time_udp_sends()?;
            let after_sends = watch.program_stats()?;
            let read_ns = time_reads(&mut watch)?;
            Ok((tcp_ns, read_ns, [start, after_tcp, after_udp, after_sends, watch.program_stats()?]))
        })?;
        let mut per_run = Vec::with_capacity(PROGRAMS.len());
        for (before, after) in start.iter().zip(&end) {
            let runs = after.runs - before.runs;
            ensure!(runs > 0, "{} never ran", after.name);
            per_run.push((after.run_time - before.run_time).as_nanos() as f64 / runs as f64);
        }
        samples.push(SockwatchCost {
            per_run: PROGRAMS.iter().copied().zip(per_run).collect(),
            tcp_cycle,
            tcp_cycle_watched,
            tcp_cycle_bpf: run_ns(&start, &after_tcp) / SOCKWATCH_TCP_CYCLES as f64,
            udp_socket,
            udp_socket_bpf: run_ns(&after_tcp, &after_udp) / SOCKWATCH_UDP_SOCKETS as f64,
            udp_send,
            udp_send_bpf: run_ns(&after_udp, &after_sends) / SOCKWATCH_UDP_SENDS as f64,
            read,
        });
    }
    let med = |figure: &dyn Fn(&SockwatchCost) -> f64| median(samples.iter().map(figure).collect());
    Ok(SockwatchCost {
        per_run: PROGRAMS.iter().enumerate().map(|(i, &name)| (name, med(&|s| s.per_run[i].1))).collect(),
        tcp_cycle: med(&|s| s.tcp_cycle),
        tcp_cycle_watched: med(&|s| s.tcp_cycle_watched),
        tcp_cycle_bpf: med(&|s| s.tcp_cycle_bpf),
        udp_socket: med(&|s| s.udp_socket),
        udp_socket_bpf: med(&|s| s.udp_socket_bpf),
        udp_send: med(&|s| s.udp_send),
        udp_send_bpf: med(&|s| s.udp_send_bpf),
        read: med(&|s| s.read),
    })
}

/// The programs' total run time between two readings, in ns.
fn run_ns(before: &[ProgramStats], after: &[ProgramStats]) -> f64 {
    before.iter().zip(after).map(|(b, a)| (a.run_time - b.run_time).as_nanos() as f64).sum()
}

/// Runs `f` on a thread in a new, unnamed network namespace with only `lo` (up), which
/// disappears with the thread, also on failure.
fn in_scratch_netns<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("creating a network namespace")?;
                // A child process starts in its parent thread's namespace.
                let status = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status().context("running ip")?;
                ensure!(status.success(), "ip link set lo up: {status}");
                f()
            })
            .join()
            .map_err(|_| anyhow!("the socket benchmark panicked"))?
    })
}

/// Wall ns per TCP connect+close cycle over loopback: the client connects and closes, the
/// server accepts, reads to the end and closes; the next cycle starts when the server is done.
fn time_tcp_cycles() -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (done, cycles) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        for _ in 0..SOCKWATCH_TCP_CYCLES {
            let (mut stream, _) = listener.accept()?;
            std::io::copy(&mut stream, &mut std::io::sink())?;
            drop(stream);
            if done.send(()).is_err() {
                break;
            }
        }
        Ok(())
    });
    let started = Instant::now();
    for i in 0..SOCKWATCH_TCP_CYCLES {
        drop(TcpStream::connect(addr).with_context(|| format!("connect #{i}"))?);
        cycles.recv_timeout(Duration::from_secs(5)).with_context(|| format!("the server did not finish cycle #{i}"))?;
    }
    let elapsed = started.elapsed();
    server.join().map_err(|_| anyhow!("the server thread panicked"))??;
    Ok(elapsed.as_nanos() as f64 / SOCKWATCH_TCP_CYCLES as f64)
}

/// Wall ns per UDP socket bound to port 0 and closed.
fn time_udp_sockets() -> Result<f64> {
    let started = Instant::now();
    for _ in 0..SOCKWATCH_UDP_SOCKETS {
        drop(UdpSocket::bind("127.0.0.1:0")?);
    }
    Ok(started.elapsed().as_nanos() as f64 / SOCKWATCH_UDP_SOCKETS as f64)
}

/// Wall ns per datagram sent from one bound UDP socket to a closed port on loopback, half
/// with sendto(), half with sendmsg().
fn time_udp_sends() -> Result<f64> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    let discard: SocketAddr = "127.0.0.1:9".parse()?;
    let mut to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let mut byte = *b"x";
    let started = Instant::now();
    for _ in 0..SOCKWATCH_UDP_SENDS / 2 {
        socket.send_to(&byte, discard)?;
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        // SAFETY: a zeroed msghdr is valid; it points at live locals for the call only.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&raw mut to).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        // SAFETY: a valid socket and a msghdr whose pointers outlive the call.
        let sent = unsafe { libc::sendmsg(std::os::fd::AsRawFd::as_raw_fd(&socket), &raw const msg, 0) };
        ensure!(sent == 1, "sendmsg: {}", std::io::Error::last_os_error());
    }
    Ok(started.elapsed().as_nanos() as f64 / SOCKWATCH_UDP_SENDS as f64)
}

/// Median ns per snapshot with [`SOCKWATCH_READ_UDP`] UDP and [`SOCKWATCH_READ_CLOSE_WAIT`]
/// CLOSE_WAIT sockets open in this namespace, after checking that it counts them all.
fn time_reads(watch: &mut SockWatch) -> Result<f64> {
    let netns = netns_inode(Path::new("/proc/thread-self/ns/net"))?;
    let discard: SocketAddr = "127.0.0.1:9".parse()?;
    let udp = (0..SOCKWATCH_READ_UDP)
        .map(|_| {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            socket.connect(discard)?;
            Ok(socket)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut held = Vec::new();
    for _ in 0..SOCKWATCH_READ_CLOSE_WAIT {
        drop(TcpStream::connect(addr)?);
        held.push(listener.accept()?.0);
    }
    let key = PortKey::udp(netns, discard.ip(), discard.ip(), discard.port());
    let counted = |watch: &mut SockWatch| -> Result<(u64, usize)> {
        let snapshot = watch.snapshot()?;
        Ok((snapshot.udp_count(&key), snapshot.close_wait.iter().filter(|r| r.key.netns == netns).count()))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while counted(watch)?.1 < SOCKWATCH_READ_CLOSE_WAIT && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = counted(watch)?;
    ensure!(seen == (SOCKWATCH_READ_UDP as u64, SOCKWATCH_READ_CLOSE_WAIT), "the watcher saw (UDP, CLOSE_WAIT) = {seen:?}");
    let mut times = Vec::with_capacity(SOCKWATCH_READS);
    for _ in 0..SOCKWATCH_READS {
        let started = Instant::now();
        watch.snapshot()?;
        times.push(started.elapsed().as_nanos() as f64);
    }
    drop((udp, held));
    Ok(median(times))
}

fn render(cost: &SockwatchCost, reps: usize) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    writeln!(
        out,
        "Socket watcher (sockwatch), median of {reps} repetitions, each in a new network namespace: {SOCKWATCH_TCP_CYCLES} \
         TCP connect+close cycles over loopback, {SOCKWATCH_UDP_SOCKETS} UDP sockets bound to port 0 and closed, \
         {SOCKWATCH_UDP_SENDS} datagrams sent (sendto and sendmsg) from a bound socket, \
         {SOCKWATCH_READS} reads with {SOCKWATCH_READ_UDP} UDP and {SOCKWATCH_READ_CLOSE_WAIT} CLOSE_WAIT sockets open. \
         Program times from the kernel's run-time statistics (host-wide: other sockets' events count too)."
    )?;
    out.push('\n');
    writeln!(out, "{:<24} | {:>9}", "program", "ns/run")?;
    writeln!(out, "{:-<24}-|-{:->9}", "", "")?;
    for (name, ns) in &cost.per_run {
        writeln!(out, "{name:<24} | {ns:>9.1}")?;
    }
    out.push('\n');
    writeln!(out, "{:<22} | {:>12} | {:>15} | {:>8}", "per", "ns without", "ns in programs", "added")?;
    writeln!(out, "{:-<22}-|-{:->12}-|-{:->15}-|-{:->8}", "", "", "", "")?;
    for (what, base, bpf) in [
        ("TCP connect+close", cost.tcp_cycle, cost.tcp_cycle_bpf),
        ("UDP socket", cost.udp_socket, cost.udp_socket_bpf),
        ("UDP datagram sent", cost.udp_send, cost.udp_send_bpf),
    ] {
        writeln!(out, "{what:<22} | {base:>12.0} | {bpf:>15.0} | {:>7.1}%", 100.0 * bpf / base)?;
    }
    writeln!(
        out,
        "TCP cycle wall time with the watcher: {:.0} ns ({:+.1}%, noisy); one read: {:.0} µs.",
        cost.tcp_cycle_watched,
        100.0 * (cost.tcp_cycle_watched / cost.tcp_cycle - 1.0),
        cost.read / 1000.0
    )?;
    Ok(out)
}
