#include <linux/bpf.h>
#define SEC(n) __attribute__((section(n), used))
SEC("xdp") int floor_tx(struct xdp_md *ctx) { return XDP_TX; }
char _license[] SEC("license") = "GPL";
