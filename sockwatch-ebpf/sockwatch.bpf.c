// SPDX-License-Identifier: GPL-2.0
//
// sockwatch: counts, per destination, the TCP sockets that hold a local port for an
// active open, the TIME_WAIT sockets still holding one, connects that failed with
// EADDRNOTAVAIL (ephemeral-port exhaustion), the UDP sockets holding an ephemeral port, and
// the TCP sockets sitting in CLOSE_WAIT (leaks). Userspace (loader/src/ports/) reads the maps.
//
// Self-contained: no vmlinux.h, no libbpf headers. Kernel structs are declared with only
// the fields used and `preserve_access_index`, so every field access is a CO-RE
// relocation that the loader (aya) resolves against the running kernel's BTF.
//
// TCP: tp_btf/inet_sock_set_state (the tracepoint exists since Linux 4.16, and the
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
//   any -> CLOSE_WAIT        the peer closed (softirq: the current task is not the owner):
//                            sw_close_wait gets the sock's address and the time; the entry
//                            goes when the sock leaves CLOSE_WAIT (the application closed
//                            it, or a reset; a full sock is freed only after CLOSE). Active
//                            and passive (accepted) socks alike.
//
// UDP has no state-change tracepoint, and the cgroup hooks do not see every port a UDP
// socket gets: post_bind4/6 runs for bind() only, connect4/6 runs before connect()'s
// autobind picks the port, sendmsg4/6 runs per datagram and only for unconnected sends
// (measured on 6.18; see ARCHITECTURE.md). So ports are not counted as events:
// cgroup/sock_create and cgroup/sock_release (on the cgroup2 root; release needs 5.9+)
// keep the address of every live UDP socket in sw_udp_socks.
//
// Both socket sets are read by iterators over those maps (iter/bpf_map_elem, 5.9+), which
// userspace runs once per report: sockwatch_udp_sum sums the UDP sockets holding an
// ephemeral port into sw_udp_ports, sockwatch_close_wait writes one record per socket in
// CLOSE_WAIT, with the socket's inode read then: a socket still in the accept queue when
// the FIN came has one once accepted. The iterators read the socks through their
// addresses with bpf_probe_read_kernel (fault-safe), and check each is still what the map
// says. sk storage would hand the iterators typed socks, but costs an allocation and an
// RCU free per socket: CLOSE_WAIT tracking cost 4.4 us per TCP connection on the target
// with it, 1.4 us with a hash entry (cargo xtask bench).

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
static long (*bpf_seq_write)(void *seq, const void *data, __u32 len) = (void *)127;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)113;

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
	unsigned char skc_state;
	union {
		struct hlist_node skc_node;
	};
	possible_net_t skc_net;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
	__u8 sk_userlocks;
	struct socket *sk_socket;
	struct sock_cgroup_data sk_cgrp_data;
} __attribute__((preserve_access_index));

/* Iterator context (DEFINE_BPF_ITER_FUNC(bpf_map_elem, ...)). */
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__bpf_map_elem {
	struct bpf_iter_meta *meta;
	void *key;
	void *value;
} __attribute__((preserve_access_index));

/* The cgroup/sock context: UAPI, fixed offsets (the verifier rewrites the accesses). */
struct bpf_sock {
	__u32 bound_dev_if;
	__u32 family;
	__u32 type;
	__u32 protocol;
};

struct inet_timewait_sock;
struct inet_timewait_death_row;
struct inet_hashinfo;

/* ---- shared with loader/src/ports/maps.rs (layouts asserted there) ---- */

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define TCP_SYN_SENT 2
#define TCP_FIN_WAIT1 4
#define TCP_FIN_WAIT2 5
#define TCP_CLOSE 7
#define TCP_CLOSE_WAIT 8
#define TCP_CLOSING 11
#define TW_BUCKETS 64
/* sk_userlocks: bind() was given an explicit port. */
#define SOCK_BINDPORT_LOCK 8

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

/* One socket in CLOSE_WAIT, as the close-wait iterator writes it. */
struct close_wait_rec {
	struct port_key key; /* remote: the peer that closed */
	__u16 lport;
	__u16 pad;
	__u32 since; /* CLOCK_MONOTONIC second it entered CLOSE_WAIT */
	__u64 inode; /* of the socket's file; 0 while still in the accept queue */
	__u64 cgroup; /* cgroup2 id of the socket (an accepted one inherits the listener's) */
};

/* sw_close_wait's value. */
struct close_wait_val {
	__u32 since;
	__u32 pad;
};

enum {
	STAT_SOCK_TABLE_FULL = 0, /* an active open could not be tracked */
	STAT_KEY_TABLE_FULL = 1,  /* a destination could not be added */
	STAT_FAIL_TABLE_FULL = 2, /* a failing process could not be added */
	STAT_CLOSE_WAIT_TABLE_FULL = 3, /* a socket entering CLOSE_WAIT could not be tracked */
	STAT_UDP_SOCK_TABLE_FULL = 4, /* a new UDP socket could not be tracked */
	STAT_UDP_KEY_TABLE_FULL = 5, /* sockets left out of the last UDP sum (userspace zeroes it) */
	STAT_COUNT = 6,
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

/* Per sock in CLOSE_WAIT (by address): since when. Sizes here bound the cost of a read:
 * an iterator visits every bucket. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct close_wait_val);
} sw_close_wait SEC(".maps");

/* The UDP socks created since the watcher was loaded and not yet released (by address;
 * the value is unused). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u32);
} sw_udp_socks SEC(".maps");

/* UDP sockets holding an ephemeral port, per destination: written by the UDP iterator,
 * emptied by userspace before each run. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct port_key);
	__type(value, __u64);
} sw_udp_ports SEC(".maps");

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

static __always_inline int key_of(struct sock *sk, struct port_key *key, __u8 proto)
{
	__builtin_memset(key, 0, sizeof(*key));
	__u16 family = sk->__sk_common.skc_family;
	key->netns = sk->__sk_common.skc_net.net->ns.inum;
	key->proto = proto;
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

/* Reads `src` of a sock known only by its address; faults read as zero. */
#define READ(dst, src) bpf_probe_read_kernel(&(dst), sizeof(dst), &(src))

/* key_of for a sock known only by its address (the iterators): each field through
 * bpf_probe_read_kernel. */
static __always_inline int key_of_addr(struct sock *sk, struct port_key *key, __u8 proto)
{
	__builtin_memset(key, 0, sizeof(*key));
	unsigned short family = 0;
	struct net *net = 0;
	__be16 dport = 0;
	READ(family, sk->__sk_common.skc_family);
	READ(net, sk->__sk_common.skc_net.net);
	READ(key->netns, net->ns.inum);
	READ(dport, sk->__sk_common.skc_dport);
	key->proto = proto;
	key->family = family;
	key->rport = __builtin_bswap16(dport);
	if (family == AF_INET) {
		__be32 laddr = 0, raddr = 0;
		READ(laddr, sk->__sk_common.skc_rcv_saddr);
		READ(raddr, sk->__sk_common.skc_daddr);
		v4_mapped(key->laddr, laddr);
		v4_mapped(key->raddr, raddr);
	} else if (family == AF_INET6) {
		READ(key->laddr, sk->__sk_common.skc_v6_rcv_saddr);
		READ(key->raddr, sk->__sk_common.skc_v6_daddr);
	} else {
		return -1;
	}
	return 0;
}

static __always_inline void count_failure(struct sock *sk)
{
	struct fail_key fail;
	__builtin_memset(&fail, 0, sizeof(fail));
	if (key_of(sk, &fail.key, IPPROTO_TCP))
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
		if (key_of(sk, &key, IPPROTO_TCP))
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
	if (newstate == TCP_CLOSE_WAIT) {
		struct close_wait_val val = { .since = bpf_ktime_get_ns() / 1000000000ULL };
		if (bpf_map_update_elem(&sw_close_wait, &addr, &val, BPF_ANY))
			stat_inc(STAT_CLOSE_WAIT_TABLE_FULL);
	} else if (oldstate == TCP_CLOSE_WAIT) {
		bpf_map_delete_elem(&sw_close_wait, &addr);
	}
	return 0;
}

/* Writes one record per socket still in CLOSE_WAIT; userspace keeps the old ones. */
SEC("iter/bpf_map_elem")
int sockwatch_close_wait(struct bpf_iter__bpf_map_elem *ctx)
{
	__u64 *addr = ctx->key;
	struct close_wait_val *val = ctx->value;
	if (!addr || !val)
		return 0;
	struct sock *sk = (struct sock *)*addr;
	unsigned char state = 0;
	READ(state, sk->__sk_common.skc_state);
	if (state != TCP_CLOSE_WAIT)
		return 0;
	struct close_wait_rec rec;
	__builtin_memset(&rec, 0, sizeof(rec));
	if (key_of_addr(sk, &rec.key, IPPROTO_TCP))
		return 0;
	READ(rec.lport, sk->__sk_common.skc_num);
	rec.since = val->since;
	/* No socket or file yet (still in the accept queue): the reads fail, inode stays 0. */
	struct socket *socket = 0;
	struct file *file = 0;
	struct inode *inode = 0;
	READ(socket, sk->sk_socket);
	READ(file, socket->file);
	READ(inode, file->f_inode);
	READ(rec.inode, inode->i_ino);
	struct cgroup *cgroup = 0;
	struct kernfs_node *kn = 0;
	READ(cgroup, sk->sk_cgrp_data.cgroup);
	READ(kn, cgroup->kn);
	READ(rec.cgroup, kn->id);
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

SEC("cgroup/sock_create")
int sockwatch_udp_create(struct bpf_sock *ctx)
{
	if (ctx->protocol == IPPROTO_UDP) {
		__u64 addr = (__u64)ctx; /* the context is the struct sock */
		__u32 one = 1;
		if (bpf_map_update_elem(&sw_udp_socks, &addr, &one, BPF_ANY))
			stat_inc(STAT_UDP_SOCK_TABLE_FULL);
	}
	return 1; /* never refuse a socket */
}

SEC("cgroup/sock_release")
int sockwatch_udp_release(struct bpf_sock *ctx)
{
	if (ctx->protocol == IPPROTO_UDP) {
		__u64 addr = (__u64)ctx;
		bpf_map_delete_elem(&sw_udp_socks, &addr);
	}
	return 1;
}

/* Sums the live UDP socks that hold a port bind() did not ask for: autobound by connect()
 * or sendmsg(), or bound to port 0. */
SEC("iter/bpf_map_elem")
int sockwatch_udp_sum(struct bpf_iter__bpf_map_elem *ctx)
{
	__u64 *addr = ctx->key;
	if (!addr)
		return 0;
	struct sock *sk = (struct sock *)*addr;
	__u16 protocol = 0, num = 0;
	__u8 userlocks = 0;
	READ(protocol, sk->sk_protocol);
	READ(num, sk->__sk_common.skc_num);
	READ(userlocks, sk->sk_userlocks);
	if (protocol != IPPROTO_UDP || !num || (userlocks & SOCK_BINDPORT_LOCK))
		return 0;
	struct port_key key;
	if (key_of_addr(sk, &key, IPPROTO_UDP))
		return 0;
	__u64 *count = bpf_map_lookup_elem(&sw_udp_ports, &key);
	if (!count) {
		__u64 zero = 0;
		bpf_map_update_elem(&sw_udp_ports, &key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&sw_udp_ports, &key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);
	else
		stat_inc(STAT_UDP_KEY_TABLE_FULL);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
