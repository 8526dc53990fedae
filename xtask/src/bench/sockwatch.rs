//! The socket watcher's overhead (`spillway_daemon::ports`), in every mode the kernel allows: real
//! sockets over loopback in fresh network namespaces, the programs' cost from the kernel's
//! run-time statistics, and the cost of one read (maps, iterators or sock_diag dumps).
//! A mode the kernel refuses is reported with the reason; the others still run.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use spillway_logging::error_chain;
use spillway_model::ports_report::Mode;
use spillway_ports::{PortKey, ProgramStats, Scope, SockWatch, WatchOptions, netns_inode};

use super::{Section, median};

/// TCP connect+close cycles and UDP sockets per repetition, each repetition in a fresh
/// network namespace (so its TIME_WAIT sockets never run the port range out).
const TCP_CYCLES: usize = 2000;
const UDP_SOCKETS: usize = 2000;
/// Datagrams sent from a bound UDP socket per repetition, half with sendto(), half with
/// sendmsg(): the watcher must add nothing per datagram (it does not follow sends).
const UDP_SENDS: usize = 2000;
/// Sockets open during the timed reads: connected UDP sockets, and server sockets left in
/// CLOSE_WAIT (what the btf mode's iterators walk, and sock_diag dumps).
const READ_UDP: usize = 1000;
const READ_CLOSE_WAIT: usize = 200;
const READS: usize = 20;

/// The figures without any watcher, ns wall time per operation.
struct Baseline {
    tcp_cycle: f64,
    udp_socket: f64,
    udp_send: f64,
}

/// One mode's figures, or their medians, in ns.
struct ModeCost {
    /// Per loaded program: run time per run.
    per_run: Vec<(&'static str, f64)>,
    /// One connect+close cycle (both ends, loopback), wall time with the watcher.
    tcp_cycle_watched: f64,
    /// The watcher's programs' run time per TCP cycle, UDP socket and datagram.
    tcp_cycle_bpf: f64,
    udp_socket_bpf: f64,
    udp_send_bpf: f64,
    /// One snapshot with the read sockets open.
    read: f64,
}

/// What the part measured: the baseline, and each mode's cost or why it could not run.
struct SockwatchBench {
    baseline: Baseline,
    modes: Vec<(Mode, Result<ModeCost, String>)>,
}

impl SockwatchBench {
    /// Adds what ran (ns) to `figures`, and the modes that could not run with the reason.
    fn add_to(&self, figures: &mut Section) {
        figures.rows.extend([
            ("tcp_cycle".to_owned(), self.baseline.tcp_cycle),
            ("udp_socket".into(), self.baseline.udp_socket),
            ("udp_send".into(), self.baseline.udp_send),
        ]);
        for (mode, cost) in &self.modes {
            let cost = match cost {
                Ok(cost) => cost,
                Err(reason) => {
                    figures.skipped.push((format!("sockwatch_{mode}"), reason.clone()));
                    continue;
                }
            };
            let key = |figure: &str| format!("sockwatch_{mode}_{figure}");
            let rows = &mut figures.rows;
            rows.extend(cost.per_run.iter().map(|(name, ns)| (key(&format!("{}_per_run", name.trim_start_matches("sockwatch_"))), *ns)));
            rows.extend([
                (key("tcp_cycle"), cost.tcp_cycle_watched),
                (key("per_tcp_cycle"), cost.tcp_cycle_bpf),
                (key("per_udp_socket"), cost.udp_socket_bpf),
                (key("per_udp_send"), cost.udp_send_bpf),
                (key("read"), cost.read),
            ]);
        }
    }
}

/// The part: the baseline and every mode, for `reps` repetitions. Only the baseline can
/// fail it; a mode that cannot run is skipped with the reason.
pub fn part(reps: usize) -> Result<Section> {
    let bench = measure(reps)?;
    let mut section = Section { text: render(&bench, reps)?, ..Section::default() };
    bench.add_to(&mut section);
    Ok(section)
}

/// Measures the baseline, then each mode.
fn measure(reps: usize) -> Result<SockwatchBench> {
    // BPF_ENABLE_STATS: on while the descriptor is open, so it is back off however this ends.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enabling BPF run-time statistics")?;
    let mut baselines = Vec::with_capacity(reps);
    for _ in 0..reps {
        baselines.push(in_scratch_netns(|| Ok((time_tcp_cycles()?, time_udp_sockets()?, time_udp_sends()?)))?);
    }
    let baseline = Baseline {
        tcp_cycle: median(baselines.iter().map(|b| b.0).collect()),
        udp_socket: median(baselines.iter().map(|b| b.1).collect()),
        udp_send: median(baselines.iter().map(|b| b.2).collect()),
    };
    let modes = Mode::ALL.into_iter().map(|mode| (mode, measure_mode(mode, reps).map_err(|e| format!("{e:#}")))).collect();
    Ok(SockwatchBench { baseline, modes })
}

fn forced(mode: Mode) -> WatchOptions {
    // The namespace of the benchmark's thread (a fresh one per repetition).
    WatchOptions { mode: mode.into(), scope: Scope::Own }
}

fn measure_mode(mode: Mode, reps: usize) -> Result<ModeCost> {
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        samples.push(in_scratch_netns(|| {
            let mut watch = SockWatch::load(forced(mode)).map_err(|e| anyhow!("{}", error_chain(&e)))?;
            let start = watch.program_stats()?;
            let tcp_cycle_watched = time_tcp_cycles()?;
            let after_tcp = watch.program_stats()?;
            time_udp_sockets()?;
            let after_udp = watch.program_stats()?;
            time_udp_sends()?;
            let after_sends = watch.program_stats()?;
            let read = time_reads(&mut watch)?;
            let end = watch.program_stats()?;
            let mut per_run = Vec::with_capacity(end.len());
            for (before, after) in start.iter().zip(&end) {
                let runs = after.runs - before.runs;
                ensure!(runs > 0, "{} never ran", after.name);
                per_run.push((after.name, (after.run_time - before.run_time).as_nanos() as f64 / runs as f64));
            }
            Ok(ModeCost {
                per_run,
                tcp_cycle_watched,
                tcp_cycle_bpf: run_ns(&start, &after_tcp) / TCP_CYCLES as f64,
                udp_socket_bpf: run_ns(&after_tcp, &after_udp) / UDP_SOCKETS as f64,
                udp_send_bpf: run_ns(&after_udp, &after_sends) / UDP_SENDS as f64,
                read,
            })
        })?);
    }
    let med = |figure: &dyn Fn(&ModeCost) -> f64| median(samples.iter().map(figure).collect());
    let names: Vec<&'static str> = samples[0].per_run.iter().map(|(name, _)| *name).collect();
    Ok(ModeCost {
        per_run: names.iter().enumerate().map(|(i, &name)| (name, med(&|s| s.per_run[i].1))).collect(),
        tcp_cycle_watched: med(&|s| s.tcp_cycle_watched),
        tcp_cycle_bpf: med(&|s| s.tcp_cycle_bpf),
        udp_socket_bpf: med(&|s| s.udp_socket_bpf),
        udp_send_bpf: med(&|s| s.udp_send_bpf),
        read: med(&|s| s.read),
    })
}

/// The programs' total run time between two readings, in ns.
fn run_ns(before: &[ProgramStats], after: &[ProgramStats]) -> f64 {
    before.iter().zip(after).map(|(b, a)| (a.run_time - b.run_time).as_nanos() as f64).fold(0.0, |sum, ns| sum + ns)
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
        for _ in 0..TCP_CYCLES {
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
    for i in 0..TCP_CYCLES {
        drop(TcpStream::connect(addr).with_context(|| format!("connect #{i}"))?);
        cycles.recv_timeout(Duration::from_secs(5)).with_context(|| format!("the server did not finish cycle #{i}"))?;
    }
    let elapsed = started.elapsed();
    server.join().map_err(|_| anyhow!("the server thread panicked"))??;
    Ok(elapsed.as_nanos() as f64 / TCP_CYCLES as f64)
}

/// Wall ns per UDP socket bound to port 0 and closed.
fn time_udp_sockets() -> Result<f64> {
    let started = Instant::now();
    for _ in 0..UDP_SOCKETS {
        drop(UdpSocket::bind("127.0.0.1:0")?);
    }
    Ok(started.elapsed().as_nanos() as f64 / UDP_SOCKETS as f64)
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
    for _ in 0..UDP_SENDS / 2 {
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
    Ok(started.elapsed().as_nanos() as f64 / UDP_SENDS as f64)
}

/// Median ns per snapshot with [`READ_UDP`] UDP and [`READ_CLOSE_WAIT`] CLOSE_WAIT sockets
/// open in this namespace, after checking that it counts them all.
fn time_reads(watch: &mut SockWatch) -> Result<f64> {
    let netns = netns_inode(Path::new("/proc/thread-self/ns/net"))?;
    let discard: SocketAddr = "127.0.0.1:9".parse()?;
    let udp = (0..READ_UDP)
        .map(|_| {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            socket.connect(discard)?;
            Ok(socket)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut held = Vec::new();
    for _ in 0..READ_CLOSE_WAIT {
        drop(TcpStream::connect(addr)?);
        held.push(listener.accept()?.0);
    }
    let key = PortKey::udp(netns, discard.ip(), discard.ip(), discard.port());
    let counted = |watch: &mut SockWatch| -> Result<(u64, usize)> {
        let snapshot = watch.snapshot()?;
        Ok((snapshot.udp_count(&key), snapshot.close_wait.iter().filter(|r| r.key.netns == netns).count()))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while counted(watch)?.1 < READ_CLOSE_WAIT && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = counted(watch)?;
    ensure!(seen == (READ_UDP as u64, READ_CLOSE_WAIT), "the watcher saw (UDP, CLOSE_WAIT) = {seen:?}");
    let mut times = Vec::with_capacity(READS);
    for _ in 0..READS {
        let started = Instant::now();
        watch.snapshot()?;
        times.push(started.elapsed().as_nanos() as f64);
    }
    drop((udp, held));
    Ok(median(times))
}

fn render(bench: &SockwatchBench, reps: usize) -> Result<String> {
    let mut out = String::new();
    let base = &bench.baseline;
    writeln!(
        out,
        "Socket watcher (sockwatch), per mode, median of {reps} repetitions, each in a new network namespace: {TCP_CYCLES} \
         TCP connect+close cycles over loopback, {UDP_SOCKETS} UDP sockets bound to port 0 and closed, {UDP_SENDS} \
         datagrams sent (sendto and sendmsg) from a bound socket, {READS} reads with {READ_UDP} UDP and {READ_CLOSE_WAIT} \
         CLOSE_WAIT sockets open. Program times from the kernel's run-time statistics (host-wide: other sockets' events \
         count too). Without a watcher: {:.0} ns per TCP cycle, {:.0} per UDP socket, {:.0} per datagram.",
        base.tcp_cycle, base.udp_socket, base.udp_send
    )?;
    for (mode, cost) in &bench.modes {
        writeln!(out)?;
        let cost = match cost {
            Ok(cost) => cost,
            Err(reason) => {
                writeln!(out, "mode {mode}: not measured: {reason}")?;
                continue;
            }
        };
        writeln!(out, "mode {mode}")?;
        if cost.per_run.is_empty() {
            writeln!(out, "  no programs: nothing runs per socket or datagram; a read costs the sock_diag dumps")?;
        } else {
            writeln!(out, "  {:<24} | {:>9}", "program", "ns/run")?;
            for (name, ns) in &cost.per_run {
                writeln!(out, "  {name:<24} | {ns:>9.1}")?;
            }
            writeln!(out, "  {:<22} | {:>15} | {:>8}", "per", "ns in programs", "added")?;
            for (what, base, bpf) in [
                ("TCP connect+close", base.tcp_cycle, cost.tcp_cycle_bpf),
                ("UDP socket", base.udp_socket, cost.udp_socket_bpf),
                ("UDP datagram sent", base.udp_send, cost.udp_send_bpf),
            ] {
                writeln!(out, "  {what:<22} | {bpf:>15.0} | {:>7.1}%", 100.0 * bpf / base)?;
            }
        }
        writeln!(
            out,
            "  TCP cycle wall time with the watcher: {:.0} ns ({:+.1}%, noisy); one read: {:.0} µs.",
            cost.tcp_cycle_watched,
            100.0 * (cost.tcp_cycle_watched / base.tcp_cycle - 1.0),
            cost.read / 1000.0
        )?;
    }
    Ok(out)
}
