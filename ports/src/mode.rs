//! Which of the watcher's modes the operator asks for (the modes themselves, and the status
//! each report carries, are wire types: `spillway_model::ports_report`).

use spillway_model::ports_report::Mode;

/// What the operator asks for: a mode, or the best the kernel allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum WatcherMode {
    /// The best mode this kernel allows (btf, else tracepoint, else sock_diag).
    #[default]
    Auto,
    /// tp_btf and map iterators (kernels that allow tracing programs).
    Btf,
    /// Classic tracepoints and batched map reads, UDP through sock_diag.
    Tracepoint,
    /// No BPF programs: sock_diag only (no failure counts).
    SockDiag,
}

impl WatcherMode {
    /// The modes to try, in order.
    pub fn candidates(self) -> &'static [Mode] {
        match self {
            WatcherMode::Auto => &Mode::ALL,
            WatcherMode::Btf => &[Mode::Btf],
            WatcherMode::Tracepoint => &[Mode::Tracepoint],
            WatcherMode::SockDiag => &[Mode::SockDiag],
        }
    }
}

impl From<Mode> for WatcherMode {
    /// The choice that forces `mode`.
    fn from(mode: Mode) -> WatcherMode {
        match mode {
            Mode::Btf => WatcherMode::Btf,
            Mode::Tracepoint => WatcherMode::Tracepoint,
            Mode::SockDiag => WatcherMode::SockDiag,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_go_from_best_to_last_resort() {
        assert_eq!(WatcherMode::Auto.candidates(), [Mode::Btf, Mode::Tracepoint, Mode::SockDiag]);
        assert_eq!(WatcherMode::SockDiag.candidates(), [Mode::SockDiag]);
        for mode in Mode::ALL {
            assert_eq!(WatcherMode::from(mode).candidates(), [mode], "forcing {mode}");
        }
        assert!(Mode::Btf < Mode::Tracepoint && Mode::Tracepoint < Mode::SockDiag, "better modes sort first");
    }
}
