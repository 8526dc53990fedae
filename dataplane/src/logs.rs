//! The eBPF programs' log records (aya-log: the `AYA_LOGS` ring buffer of an object), for
//! rare events of the programs off the per-packet path (the second-chance program, the
//! decapsulator). Each record's message is an `event=… key=value` line, so `logging.rs`
//! renders it like every other line of `lbd` and the agent.

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::{Interest, unix::AsyncFd};

use super::DataplaneError;

/// The reader of `ebpf`'s log records, handing each to `logger`.
pub fn reader<T: log::Log>(ebpf: &mut Ebpf, logger: T) -> Result<EbpfLogger<T>, DataplaneError> {
    EbpfLogger::init_with_logger(ebpf, logger).map_err(|e| DataplaneError::Logs(Box::new(e)))
}

/// Forwards `ebpf`'s log records to this process's logger until the task is aborted: the
/// task wakes only when a record arrives.
pub fn forward(ebpf: &mut Ebpf) -> Result<tokio::task::JoinHandle<()>, DataplaneError> {
    let reader = reader(ebpf, log::logger())?;
    // SAFETY: the reader owns its ring buffer's descriptor, open until the reader (moved
    // into the AsyncFd) is dropped, and `as_raw_fd` always returns that one.
    let mut fd = unsafe { AsyncFd::register_with_interest(reader, Interest::READABLE) }.map_err(|e| DataplaneError::Logs(Box::new(e)))?;
    Ok(tokio::spawn(async move {
        while let Ok(mut ready) = fd.readable_mut().await {
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    }))
}
