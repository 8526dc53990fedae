//! Running an XDP program on one frame with BPF_PROG_TEST_RUN (packet tests, benchmarks).

use aya::programs::{TestRun, TestRunOptions, Xdp};

use super::DataplaneError;

/// Room for encapsulation headers in the output buffer.
pub const HEADROOM_BYTES: usize = 256;

#[derive(Debug)]
pub struct RunOutcome {
    /// The XDP action (`XDP_DROP` = 1, `XDP_PASS` = 2, `XDP_TX` = 3, `XDP_REDIRECT` = 4).
    pub action: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// Runs `program` once on `frame` as if it arrived on `ingress_ifindex` of the calling
/// thread's network namespace. That interface needs a native XDP program attached (any),
/// or the kernel has no receive queue to run against.
pub fn run(program: &Xdp, frame: &[u8], ingress_ifindex: u32) -> Result<RunOutcome, DataplaneError> {
    let mut out = vec![0u8; frame.len() + HEADROOM_BYTES];
    let (action, len) = run_into(program, frame, ingress_ifindex, &mut out)?;
    out.truncate(len);
    Ok(RunOutcome { action, frame: out })
}

/// Like [`run`], writing the output frame into `out` (at least `frame.len() +
/// HEADROOM_BYTES` long); returns the action and the output length. Allocation-free, for
/// benchmark loops.
pub fn run_into(program: &Xdp, frame: &[u8], ingress_ifindex: u32, out: &mut [u8]) -> Result<(u32, usize), DataplaneError> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex. The kernel wants data = 0 and data_end = the frame length.
    let md: [u32; 6] = [0, frame.len() as u32, 0, ingress_ifindex, 0, 0];
    let ctx: &[u8] = bytemuck::cast_slice(&md);
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(out);
    opts.ctx_in = Some(ctx);
    let result = program.test_run(opts).map_err(|source| DataplaneError::Program { name: "test_run", source })?;
    Ok((result.return_value, result.data_size_out as usize))
}
