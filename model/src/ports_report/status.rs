//! How the port watcher watches. Kernels differ in what they let a program hook: some refuse
//! every `BPF_PROG_TYPE_TRACING` program (tp_btf, iterators) while running classic
//! tracepoints and cgroup programs, some refuse BPF altogether. The watcher therefore has
//! three modes, best first, and picks the best one the kernel allows when it loads
//! (`lbd --watcher-mode auto`); each report says which mode it came from and what, in that
//! mode, is and is not watched.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A mode the watcher can run in, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// BTF-typed tracepoint for TCP states, map iterators walking the UDP and CLOSE_WAIT
    /// tables in the kernel, syscall tracepoints, cgroup socket hooks.
    Btf,
    /// Classic tracepoints (TCP states, syscalls); the maps are read from userspace in
    /// batches; UDP sockets and CLOSE_WAIT inodes come from sock_diag.
    Tracepoint,
    /// No BPF: the kernel's socket tables through sock_diag, like `ss`.
    SockDiag,
}

impl Mode {
    /// Every mode, best first.
    pub const ALL: [Mode; 3] = [Mode::Btf, Mode::Tracepoint, Mode::SockDiag];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Btf => "btf",
            Mode::Tracepoint => "tracepoint",
            Mode::SockDiag => "sock_diag",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One watched thing and how it is watched (or why it is not).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// What is watched, e.g. `tcp ports`.
    pub what: String,
    /// With what (a hook, a map read, sock_diag), or why not.
    pub how: String,
}

/// The watcher's mode and coverage, part of every report. Field names are a public
/// interface (JSON): add, never rename.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherStatus {
    pub mode: Mode,
    pub watching: Vec<Part>,
    pub not_watched: Vec<Part>,
    /// Better modes the kernel refused when this one was chosen, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,
}

/// A mode the kernel did not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub mode: Mode,
    pub reason: String,
}

impl Refusal {
    /// `error`'s chain as one line: a verifier log, when the error carries one, is kept to
    /// its last line (what the verifier refused), so the refusal reads as a sentence in a
    /// log line, a report and `lbctl status` rather than as an escaped page of log.
    pub fn new(mode: Mode, error: &str) -> Refusal {
        let mut lines = error.lines().map(str::trim).filter(|l| !l.is_empty());
        let first = lines.next().unwrap_or_default();
        let reason = match lines.next_back() {
            Some(last) => format!("{first} … {last}"),
            None => first.to_owned(),
        };
        Refusal { mode, reason }
    }
}

impl WatcherStatus {
    pub fn new(mode: Mode) -> WatcherStatus {
        WatcherStatus { mode, watching: Vec::new(), not_watched: Vec::new(), refused: Vec::new() }
    }

    pub fn watch(&mut self, what: &str, how: impl Into<String>) {
        self.watching.push(Part { what: what.to_owned(), how: how.into() });
    }

    pub fn skip(&mut self, what: &str, why: impl Into<String>) {
        self.not_watched.push(Part { what: what.to_owned(), how: why.into() });
    }

    /// Whether `what` (one of the [`parts`] names) is watched.
    pub fn watches(&self, what: &str) -> bool {
        self.watching.iter().any(|p| p.what == what)
    }

    /// `mode btf, 6 of 6 parts watched`, or `… (not: tcp ports, …)`: `lbctl status`'s line
    /// (the summary, with how each part is watched, is `lbctl ports`').
    pub fn brief(&self) -> String {
        let total = self.watching.len() + self.not_watched.len();
        let mut line = format!("mode {}, {} of {total} parts watched", self.mode, self.watching.len());
        if !self.not_watched.is_empty() {
            let missing: Vec<&str> = self.not_watched.iter().map(|p| p.what.as_str()).collect();
            line.push_str(&format!(" (not: {})", missing.join(", ")));
        }
        line
    }

    /// `watching with: …; not watched: …`, the line `lbctl ports` and the log show.
    pub fn summary(&self) -> String {
        let list = |parts: &[Part]| parts.iter().map(|p| format!("{} ({})", p.what, p.how)).collect::<Vec<_>>().join(", ");
        let mut line = format!("mode {}; watching with: {}", self.mode, list(&self.watching));
        if !self.not_watched.is_empty() {
            line.push_str(&format!("; not watched: {}", list(&self.not_watched)));
        }
        line
    }
}

/// The names of the watched parts, as [`Part::what`] carries them.
pub mod parts {
    /// Ports held per TCP destination, incl. TIME_WAIT.
    pub const TCP_PORTS: &str = "tcp ports";
    /// TCP `connect()` failing with EADDRNOTAVAIL, per process.
    pub const CONNECT_FAILURES: &str = "tcp connect failures";
    /// `bind()` to port 0 and UDP `connect()` autobind failing, per process.
    pub const BIND_FAILURES: &str = "bind/udp connect failures";
    /// UDP sockets on ephemeral ports per destination.
    pub const UDP_PORTS: &str = "udp ports";
    /// Sockets left in CLOSE_WAIT, per process.
    pub const CLOSE_WAIT: &str = "close_wait leaks";
    /// Cumulative active opens and TIME_WAIT entries (event counts).
    pub const OPENS: &str = "open counts";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_with_a_verifier_log_reads_as_one_line() {
        let error = "loading sockwatch_set_state: the BPF_PROG_LOAD syscall failed. Verifier output: \n0: (79) r1 = *(u64 *)(r1 +0)\n\ninvalid bpf_context access off=0 size=8\n";
        let refusal = Refusal::new(Mode::Btf, error);
        assert_eq!(
            refusal.reason,
            "loading sockwatch_set_state: the BPF_PROG_LOAD syscall failed. Verifier output: … invalid bpf_context access off=0 size=8"
        );
        assert_eq!(Refusal::new(Mode::Btf, "Operation not permitted (os error 1)").reason, "Operation not permitted (os error 1)");
    }

    #[test]
    fn the_summary_names_what_is_and_is_not_watched() {
        let mut status = WatcherStatus::new(Mode::SockDiag);
        status.watch(parts::TCP_PORTS, "sock_diag");
        status.skip(parts::CONNECT_FAILURES, "needs BPF");
        assert_eq!(status.summary(), "mode sock_diag; watching with: tcp ports (sock_diag); not watched: tcp connect failures (needs BPF)");
        assert_eq!(status.brief(), "mode sock_diag, 1 of 2 parts watched (not: tcp connect failures)");
        assert!(status.watches(parts::TCP_PORTS) && !status.watches(parts::CONNECT_FAILURES));
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["mode"], "sock_diag");
        assert!(json.get("refused").is_none());
    }
}
