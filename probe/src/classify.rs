//! What a socket error says about the backend.

use std::io;

use spillway_model::ProbeOutcome;

/// The balancer's own trouble (no port, no buffers, no descriptors, no memory, a socket option
/// or its own firewall refused) is `Unknown`: it says nothing about the backend. Anything else
/// the socket reports is the backend's.
pub(super) fn classify(error: &io::Error) -> ProbeOutcome {
    match error.raw_os_error() {
        Some(libc::EADDRNOTAVAIL | libc::ENOBUFS | libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EADDRINUSE | libc::EPERM) => {
            ProbeOutcome::Unknown
        }
        Some(libc::ETIMEDOUT) => ProbeOutcome::Timeout,
        _ => ProbeOutcome::Failure { reason: label(error) },
    }
}

fn label(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNREFUSED) => "refused".to_owned(),
        Some(libc::EHOSTUNREACH) => "host_unreachable".to_owned(),
        Some(libc::ENETUNREACH) => "net_unreachable".to_owned(),
        Some(libc::ECONNRESET) => "reset".to_owned(),
        Some(libc::EPIPE) => "closed_early".to_owned(),
        _ => error.to_string().replace(' ', "_"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_errors_are_unknown_and_backend_errors_are_failures() {
        for errno in [libc::EADDRNOTAVAIL, libc::ENOBUFS, libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EADDRINUSE, libc::EPERM] {
            assert_eq!(classify(&io::Error::from_raw_os_error(errno)), ProbeOutcome::Unknown, "errno {errno}");
        }
        for (errno, reason) in [
            (libc::ECONNREFUSED, "refused"),
            (libc::EHOSTUNREACH, "host_unreachable"),
            (libc::ENETUNREACH, "net_unreachable"),
            (libc::ECONNRESET, "reset"),
            (libc::EPIPE, "closed_early"),
        ] {
            assert_eq!(classify(&io::Error::from_raw_os_error(errno)), ProbeOutcome::Failure { reason: reason.to_owned() });
        }
        assert_eq!(classify(&io::Error::from_raw_os_error(libc::ETIMEDOUT)), ProbeOutcome::Timeout);
    }
}
