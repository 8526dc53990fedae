// SPDX-License-Identifier: GPL-2.0
//
// sockwatch: counts, per destination, the TCP sockets that hold a local port for an
// active open, the TIME_WAIT sockets still holding one, and connects that failed with
// EADDRNOTAVAIL (ephemeral-port exhaustion). Userspace (loader/src/ports/) reads the maps.
//
// Self-contained: no vmlinux.h, no libbpf headers. Kernel structs are declared with only
// the fields used and `preserve_access_index`, so every field access is a CO-RE
// relocation that the loader (aya) resolves against the running kernel's BTF.
//
// One hook: tp_btf/inet_sock_set_state (the tracepoint exists since Linux 4.16, and the
// BTF-typed tp_btf form, which hands over the sock pointer, since 5.5; needs
// CONFIG_DEBUG_INFO_BTF). It sees every TCP state change, in the context of the task that
// caused it (connect() for the failures), and needs neither ftrace nor kprobes:
// fentry/fexit/kprobe are refused (EPERM) on the target kernel, so the obvious hooks on
// inet_twsk_hashdance_schedule / inet_twsk_kill / __inet_hash_connect are not usable.
//   CLOSE -> SYN_SENT        an active open: track the socket, count it for its
//                            destination.
//   SYN_SENT -> CLOSE with no local port (skc_num == 0)
//                            inet_hash_connect() found no free port: connect() fails
//                            with EADDRNOTAVAIL. Counted per destination and per process.
//   FIN_WAIT1/FIN_WAIT2/CLOSING -> CLOSE with the sock already unhashed
//                            tcp_time_wait() has just put a timewait sock in its place
//                            (inet_twsk_hashdance_schedule unhashes the full sock before
//                            tcp_done() sets CLOSE; an ordinary close unhashes after the
//                            tracepoint). The kernel reports no transition into
//                            TIME_WAIT and nothing when a timewait sock dies, so
//                            TIME_WAIT entries are counted per destination in one-second
//                            buckets and userspace sums the last TCP_TIMEWAIT_LEN (60 s).
//   any -> CLOSE             the tracked full sock is gone.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __always_inline inline __attribute__((always_inline))

enum { BPF_MAP_TYPE_HASH = 1, BPF_MAP_TYPE_ARRAY = 2 };
enum { BPF_ANY = 0, BPF_NOEXIST = 1 };

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_get_current_comm)(void *buf, __u32 size_of_buf) = (void *)16;
static __u64 (*bpf_get_current_cgroup_id)(void) = (void *)80;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;

/* ---- kernel types: only what is read; CO-RE finds the real offsets ---- */

struct in6_addr {
	union {
		__be32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct hlist_node {
	struct hlist_node *next, **pprev;
} __attribute__((preserve_access_index));

struct sock_common {
	union {
		struct {
			__be32 skc_daddr;
			__be32 skc_rcv_saddr;
		};
	};
	union {
		struct {
			__be16 skc_dport;
			__u16 skc_num;
		};
	};
	unsigned short skc_family;
	union {
		struct hlist_node skc_node;
	};
	possible_net_t skc_net;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

struct inet_timewait_sock;
struct inet_timewait_death_row;
struct inet_hashinfo;

/* ---- shared with loader/src/ports/maps.rs (layouts asserted there) ---- */

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define TCP_SYN_SENT 2
#define TCP_FIN_WAIT1 4
#define TCP_FIN_WAIT2 5
#define TCP_CLOSE 7
#define TCP_CLOSING 11
#define TW_BUCKETS 64

/* One destination as seen from one network namespace. Addresses are 16 bytes,
 * IPv4 as ::ffff:a.b.c.d; rport in host byte order. */
struct port_key {
	__u32 netns;
	__u16 rport;
	__u8 proto;
	__u8 family;
	__u8 laddr[16];
	__u8 raddr[16];
};

struct port_counts {
	__s64 active;        /* full sockets from SYN_SENT until CLOSE */
	__u64 time_wait_total; /* timewait socks created (monotonic) */
	__u64 failures;      /* connects that failed with EADDRNOTAVAIL */
	__u64 opened;        /* active opens seen (monotonic) */
	/* Timewait socks created in second tw_sec[i] (CLOCK_MONOTONIC), i = sec % 64. */
	__u32 tw_sec[TW_BUCKETS];
	__u32 tw_count[TW_BUCKETS];
};

struct fail_key {
	struct port_key key;
	__u32 tgid;
	__u32 pad;
	__u64 cgroup;
	char comm[16];
};

enum {
	STAT_SOCK_TABLE_FULL = 0, /* an active open could not be tracked */
	STAT_KEY_TABLE_FULL = 1,  /* a destination could not be added */
	STAT_FAIL_TABLE_FULL = 2, /* a failing process could not be added */
	STAT_COUNT = 3,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct port_key);
	__type(value, struct port_counts);
} sw_ports SEC(".maps");

/* Per tracked socket (full or timewait, by address): its destination key. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, __u64);
	__type(value, struct port_key);
} sw_socks SEC(".maps");



struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fail_key);
	__type(value, __u64);
} sw_failures SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} sw_stats SEC(".maps");

/* One all-zero port_counts, never written: the initial value of a new destination (too
 * large for the 512-byte stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct port_counts);
} sw_zero SEC(".maps");

static __always_inline void stat_inc(__u32 index)
{
	__u64 *value = bpf_map_lookup_elem(&sw_stats, &index);
	if (value)
		__sync_fetch_and_add(value, 1);
}

static __always_inline struct port_counts *counts_for(const struct port_key *key)
{
	struct port_counts *counts = bpf_map_lookup_elem(&sw_ports, key);
	if (counts)
		return counts;
	__u32 index = 0;
	struct port_counts *zero = bpf_map_lookup_elem(&sw_zero, &index);
	if (!zero)
		return 0;
	/* NOEXIST: a racing CPU may have inserted it; the lookup below finds either. */
	bpf_map_update_elem(&sw_ports, key, zero, BPF_NOEXIST);
	counts = bpf_map_lookup_elem(&sw_ports, key);
	if (!counts)
		stat_inc(STAT_KEY_TABLE_FULL);
	return counts;
}

static __always_inline void v4_mapped(__u8 *out, __be32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

/* Word by word: a memcpy from a CO-RE-relocated source would become a libcall. */
static __always_inline void copy6(__u8 *out, const struct in6_addr *addr)
{
	__u32 *words = (__u32 *)out;
	words[0] = addr->in6_u.u6_addr32[0];
	words[1] = addr->in6_u.u6_addr32[1];
	words[2] = addr->in6_u.u6_addr32[2];
	words[3] = addr->in6_u.u6_addr32[3];
}

static __always_inline int key_of(struct sock *sk, struct port_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	__u16 family = sk->__sk_common.skc_family;
	key->netns = sk->__sk_common.skc_net.net->ns.inum;
	key->proto = IPPROTO_TCP;
	key->family = family;
	__be16 dport = sk->__sk_common.skc_dport;
	key->rport = __builtin_bswap16(dport);
	if (family == AF_INET) {
		v4_mapped(key->laddr, sk->__sk_common.skc_rcv_saddr);
		v4_mapped(key->raddr, sk->__sk_common.skc_daddr);
	} else if (family == AF_INET6) {
		copy6(key->laddr, &sk->__sk_common.skc_v6_rcv_saddr);
		copy6(key->raddr, &sk->__sk_common.skc_v6_daddr);
	} else {
		return -1;
	}
	return 0;
}

static __always_inline void count_failure(struct sock *sk)
{
	struct fail_key fail;
	__builtin_memset(&fail, 0, sizeof(fail));
	if (key_of(sk, &fail.key))
		return;
	struct port_counts *counts = counts_for(&fail.key);
	if (counts)
		__sync_fetch_and_add(&counts->failures, 1);
	fail.tgid = bpf_get_current_pid_tgid() >> 32;
	fail.cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(fail.comm, sizeof(fail.comm));
	__u64 *value = bpf_map_lookup_elem(&sw_failures, &fail);
	if (!value) {
		__u64 zero = 0;
		bpf_map_update_elem(&sw_failures, &fail, &zero, BPF_NOEXIST);
		value = bpf_map_lookup_elem(&sw_failures, &fail);
	}
	if (value)
		__sync_fetch_and_add(value, 1);
	else
		stat_inc(STAT_FAIL_TABLE_FULL);
}

static __always_inline void count_time_wait(struct port_counts *counts)
{
	__u32 sec = bpf_ktime_get_ns() / 1000000000ULL;
	__u32 i = sec % TW_BUCKETS;
	/* First timewait of a new second recycles the bucket. Two CPUs doing so at once
	 * may lose one count (rare; userspace also has time_wait_total). */
	if (counts->tw_sec[i] != sec) {
		counts->tw_count[i] = 0;
		counts->tw_sec[i] = sec;
	}
	__sync_fetch_and_add(&counts->tw_count[i], 1);
	__sync_fetch_and_add(&counts->time_wait_total, 1);
}

/* The tracked full sock `addr` reached CLOSE: stop counting it; `to_time_wait` when a
 * timewait sock took over its port. */
static __always_inline void untrack_sock(__u64 addr, int to_time_wait)
{
	struct port_key *old = bpf_map_lookup_elem(&sw_socks, &addr);
	if (!old)
		return;
	struct port_key key = *old;
	bpf_map_delete_elem(&sw_socks, &addr);
	struct port_counts *counts = bpf_map_lookup_elem(&sw_ports, &key);
	if (!counts)
		return;
	__sync_fetch_and_add(&counts->active, -1);
	if (to_time_wait)
		count_time_wait(counts);
}

SEC("tp_btf/inet_sock_set_state")
int sockwatch_set_state(unsigned long long *ctx)
{
	struct sock *sk = (struct sock *)ctx[0];
	int oldstate = (int)ctx[1];
	int newstate = (int)ctx[2];
	__u64 addr = (__u64)sk;

	if (!sk || sk->sk_protocol != IPPROTO_TCP)
		return 0;
	if (newstate == TCP_SYN_SENT) {
		struct port_key key;
		if (key_of(sk, &key))
			return 0;
		untrack_sock(addr, 0); /* never expected: a second open without CLOSE */
		if (bpf_map_update_elem(&sw_socks, &addr, &key, BPF_ANY)) {
			stat_inc(STAT_SOCK_TABLE_FULL);
			return 0;
		}
		struct port_counts *counts = counts_for(&key);
		if (!counts) {
			bpf_map_delete_elem(&sw_socks, &addr);
			return 0;
		}
		__sync_fetch_and_add(&counts->active, 1);
		__sync_fetch_and_add(&counts->opened, 1);
	} else if (newstate == TCP_CLOSE && oldstate != TCP_CLOSE) {
		if (oldstate == TCP_SYN_SENT && sk->__sk_common.skc_num == 0)
			count_failure(sk);
		int to_time_wait = (oldstate == TCP_FIN_WAIT1 || oldstate == TCP_FIN_WAIT2 || oldstate == TCP_CLOSING) &&
				   !sk->__sk_common.skc_node.pprev;
		untrack_sock(addr, to_time_wait);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
