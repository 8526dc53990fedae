//! The raw `bpf(2)` call, for the few things the harness does without aya (a peer's
//! `XDP_PASS` program, detaching a link as an intruder would).

use anyhow::{Result, bail};

/// Times a call that failed with EAGAIN is made again, as libbpf and aya do: the verifier
/// gives up with EAGAIN when a signal is pending (a test's children exiting send SIGCHLD).
const EAGAIN_TRIES: usize = 5;

/// `bpf(cmd, attr)`: its non-negative result, or the error naming `cmd`.
pub(crate) fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<libc::c_long> {
    let mut tries = 0;
    loop {
        // SAFETY: `attr` is a zero-padded bpf_attr of the size passed; the kernel reads only it.
        let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
        if ret >= 0 {
            return Ok(ret);
        }
        let error = std::io::Error::last_os_error();
        tries += 1;
        if error.raw_os_error() != Some(libc::EAGAIN) || tries == EAGAIN_TRIES {
            bail!("bpf({cmd}): {error}");
        }
    }
}
