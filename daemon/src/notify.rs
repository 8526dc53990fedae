//! systemd's readiness protocol (`Type=notify`): one datagram per state change to the Unix
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). Without
//! the variable (not under systemd) nothing is sent. A failure to notify is logged, never
//! fatal: systemd then times the start out and restarts the service.

use std::{
    io,
    os::{linux::net::SocketAddrExt, unix::net::UnixDatagram},
};

use spillway_logging::event;

/// Sends `message` (newline-separated `KEY=VALUE` assignments) to systemd.
pub fn notify(message: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else { return };
    match send(&target.to_string_lossy(), message) {
        Ok(()) => event!(debug, "sd_notify", message = message.replace('\n', " ")),
        Err(e) => event!(warn, "sd_notify_failed", message = message.replace('\n', " "), error = e),
    }
}

fn send(target: &str, message: &str) -> io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    match target.strip_prefix('@') {
        Some(name) => socket.send_to_addr(message.as_bytes(), &std::os::unix::net::SocketAddr::from_abstract_name(name)?),
        None => socket.send_to(message.as_bytes(), target),
    }
    .map(drop)
}

/// `READY=1` with a one-line status for `systemctl status`.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// `RELOADING=1` (with the monotonic time systemd wants alongside it), before a reload.
pub fn reloading() {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| t.tv_sec() * 1_000_000 + t.tv_nsec() / 1000);
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={now}"));
}

pub fn stopping() {
    notify("STOPPING=1");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDir;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let tmp = TempDir::new("notify");
        let path = tmp.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
        let name = format!("spw-{}-notify", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let abstract_server = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = abstract_server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        assert!(send(tmp.path().join("none").to_str().unwrap(), "READY=1").is_err());
    }
}
