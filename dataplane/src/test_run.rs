//! Running an XDP or tc program on one frame with BPF_PROG_TEST_RUN (packet tests,
//! benchmarks).

use aya::programs::{SchedClassifier, TestRun, TestRunOptions, Xdp};

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
    let run = run_into(program, frame, ingress_ifindex, &mut out)?;
    out.truncate(run.len);
    Ok(RunOutcome { action: run.action, frame: out })
}

/// One run into a caller's buffer.
#[derive(Clone, Copy, Debug)]
pub struct RunInto {
    pub action: u32,
    /// Bytes of the output frame written to the buffer.
    pub len: usize,
    /// The run time the kernel measured (what benchmarks report).
    pub duration_ns: u64,
}

/// Like [`run`], writing the output frame into `out` (at least `frame.len() +
/// HEADROOM_BYTES` long). Allocation-free, for benchmark loops.
pub fn run_into(program: &Xdp, frame: &[u8], ingress_ifindex: u32, out: &mut [u8]) -> Result<RunInto, DataplaneError> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex. The kernel wants data = 0 and data_end = the frame length.
    let md: [u32; 6] = [0, frame.len() as u32, 0, ingress_ifindex, 0, 0];
    let ctx: &[u8] = bytemuck::cast_slice(&md);
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(out);
    opts.ctx_in = Some(ctx);
    let result = program.test_run(opts).map_err(|source| DataplaneError::Program { name: "test_run", source })?;
    Ok(RunInto { action: result.return_value, len: result.data_size_out as usize, duration_ns: result.duration.as_nanos() as u64 })
}

/// Words of the `struct __sk_buff` a tc test run takes as its context (192 bytes), and the
/// two the runs here set.
const SKB_WORDS: usize = 48;
const SKB_MARK: usize = 2;
const SKB_IFINDEX: usize = 10;

/// Runs the tc `program` once on `frame` (from its Ethernet header) as a packet with socket
/// mark `mark` sent through `ifindex` of the calling thread's network namespace. `action` is
/// the tc verdict (`TC_ACT_SHOT` = 2, `TC_ACT_REDIRECT` = 7); nothing is actually sent.
pub fn run_classifier(program: &SchedClassifier, frame: &[u8], mark: u32, ifindex: u32) -> Result<RunOutcome, DataplaneError> {
    let mut skb = [0u32; SKB_WORDS];
    skb[SKB_MARK] = mark;
    skb[SKB_IFINDEX] = ifindex;
    let mut out = vec![0u8; frame.len() + HEADROOM_BYTES];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    opts.ctx_in = Some(bytemuck::cast_slice(&skb));
    let result = program.test_run(opts).map_err(|source| DataplaneError::Program { name: "test_run", source })?;
    out.truncate(result.data_size_out as usize);
    Ok(RunOutcome { action: result.return_value, frame: out })
}
