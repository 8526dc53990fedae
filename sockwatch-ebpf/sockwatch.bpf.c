// SPDX-License-Identifier: GPL-2.0
//
// sockwatch: counts, per destination, the TCP sockets that hold a local port for an
// active open, the TIME_WAIT sockets still holding one, calls that failed for want of an
// ephemeral port (TCP connect: EADDRNOTAVAIL; bind to port 0: EADDRINUSE; UDP
// connect autobind: EAGAIN), the UDP sockets holding an ephemeral port, and
// the TCP sockets sitting in CLOSE_WAIT (leaks). Userspace (ports/src/) reads the maps.
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
// Kernels that refuse every tracing program (tp_btf, iterators) still run the classic
// tracepoint/sock/inet_sock_set_state: its record carries the sock's address, read with
// bpf_probe_read_kernel. Both programs share one handler (on_state); the loader attaches
// one of them (ports/src/bpf.rs).
//   CLOSE -> SYN_SENT        an active open: track the socket, count it for its
//                            destination.
//   SYN_SENT -> CLOSE with no source port ever assigned (inet_sport == 0, skc_num == 0)
//                            inet_hash_connect() found no free port: connect() fails
//                            with EADDRNOTAVAIL. Counted per destination and per process.
//                            skc_num alone cannot tell: tcp_set_state(TCP_CLOSE) releases
//                            the port (inet_put_port zeroes skc_num) before the
//                            tracepoint fires, so a refused, reset, timed-out, unreachable
//                            or abandoned connect also shows skc_num == 0; inet_sport is
//                            left as inet_hash_connect() set it, and stays 0 only when it
//                            found no port.
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
// Both socket sets are read by iterators over those maps (iter/bpf_map_elem, 5.9+; where
// iterators are refused, userspace reads the CLOSE_WAIT table itself, and UDP from sock_diag),
// which userspace runs once per report: sockwatch_udp_sum sums the UDP sockets holding an
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
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)112;
static __u64 (*bpf_get_current_task)(void) = (void *)35;

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
	unsigned short i_mode;
	unsigned long i_ino;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
	void *private_data;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
	struct sock *sk;
} __attribute__((preserve_access_index));

/* The calling task's file table: task->files->fdt->fd[fd]->private_data (a socket's file
 * points at its struct socket). */
struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	struct files_struct *files;
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

/* The source port a connect() was given (network order); kept when the port is released. */
struct inet_sock {
	struct sock sk;
	__be16 inet_sport;
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

/* ---- shared with ports/src/maps.rs (layouts asserted there) ---- */

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

/* Failed calls, per destination and process. For bind(): local is the address asked
 * for, remote unspecified (port 0). For a UDP connect(): local is the
 * socket's (unspecified: it had no port), remote the address asked for. */
struct fail_key {
	struct port_key key;
	__u32 tgid;
	__u16 call; /* enum call */
	__u16 err;  /* the errno the call returned (positive) */
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

/* sw_close_wait's value: what is known when the socket enters CLOSE_WAIT. Userspace
 * reads it directly where the kernel refuses map iterators (the inode then comes from
 * sock_diag). */
struct close_wait_val {
	struct port_key key; /* remote: the peer that closed */
	__u16 lport;
	__u16 pad;
	__u32 since; /* CLOCK_MONOTONIC second it entered CLOSE_WAIT */
	__u64 cgroup; /* cgroup2 id of the socket */
};

enum {
	STAT_SOCK_TABLE_FULL = 0, /* an active open could not be tracked */
	STAT_KEY_TABLE_FULL = 1,  /* a destination could not be added */
	STAT_FAIL_TABLE_FULL = 2, /* a failing process could not be added */
	STAT_CLOSE_WAIT_TABLE_FULL = 3, /* a socket entering CLOSE_WAIT could not be tracked */
	STAT_UDP_SOCK_TABLE_FULL = 4, /* a new UDP socket could not be tracked */
	STAT_UDP_KEY_TABLE_FULL = 5, /* sockets left out of the last UDP sum (userspace zeroes it) */
	STAT_PENDING_TABLE_FULL = 6, /* a bind/connect/send could not be followed to its exit */
	STAT_COUNT = 7,
};

/* fail_key.call: the call that failed for want of a port. */
enum call {
	CALL_CONNECT = 0, /* TCP (EADDRNOTAVAIL, from inet_sock_set_state) or UDP (EAGAIN) */
	CALL_BIND = 1,    /* bind() to port 0: EADDRINUSE */
};

#define EAGAIN 11
#define EADDRINUSE 98
#define EADDRNOTAVAIL 99

/* A bind/connect in flight on one thread, from its sys_enter to its
 * sys_exit tracepoint: what the exit needs to count a failure. */
struct pending {
	__u32 fd;
	__u16 call;
	__u16 family; /* of the address asked for */
	__u16 port;   /* asked for, host byte order */
	__u16 pad;
	__u8 addr[16]; /* asked for: IPv6, or IPv4-mapped */
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

/* Per thread (pid_tgid) in a watched syscall. Every exit deletes its thread's entry; an
 * entry left by a thread that was in the call when the watcher attached is overwritten by
 * its next call. Sized for that many threads blocked in connect() at once. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pending);
} sw_pending SEC(".maps");

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

/* Counts one failure of `fail` (key, call and errno set) for its destination and for the
 * current process. */
static __always_inline void count_fail_key(struct fail_key *fail)
{
	struct port_counts *counts = counts_for(&fail->key);
	if (counts)
		__sync_fetch_and_add(&counts->failures, 1);
	fail->tgid = bpf_get_current_pid_tgid() >> 32;
	fail->cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(fail->comm, sizeof(fail->comm));
	__u64 *value = bpf_map_lookup_elem(&sw_failures, fail);
	if (!value) {
		__u64 zero = 0;
		bpf_map_update_elem(&sw_failures, fail, &zero, BPF_NOEXIST);
		value = bpf_map_lookup_elem(&sw_failures, fail);
	}
	if (value)
		__sync_fetch_and_add(value, 1);
	else
		stat_inc(STAT_FAIL_TABLE_FULL);
}

/* A TCP connect() that found no free port (EADDRNOTAVAIL). */
static __always_inline void count_failure(struct sock *sk, const int typed)
{
	struct fail_key fail;
	__builtin_memset(&fail, 0, sizeof(fail));
	if (typed ? key_of(sk, &fail.key, IPPROTO_TCP) : key_of_addr(sk, &fail.key, IPPROTO_TCP))
		return;
	fail.call = CALL_CONNECT;
	fail.err = EADDRNOTAVAIL;
	count_fail_key(&fail);
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

/* One TCP state change of `sk`. `typed`: the sock is a BTF-typed pointer (tp_btf), read
 * with plain loads; otherwise (the classic tracepoint, whose record carries the sock only
 * as an address) every field is read with bpf_probe_read_kernel. A constant at each call
 * site, so each program keeps only its own kind of access. */
static __always_inline void on_state(struct sock *sk, int oldstate, int newstate, const int typed)
{
	__u64 addr = (__u64)sk;

	if (newstate == TCP_SYN_SENT) {
		struct port_key key;
		if (typed ? key_of(sk, &key, IPPROTO_TCP) : key_of_addr(sk, &key, IPPROTO_TCP))
			return;
		untrack_sock(addr, 0); /* never expected: a second open without CLOSE */
		if (bpf_map_update_elem(&sw_socks, &addr, &key, BPF_ANY)) {
			stat_inc(STAT_SOCK_TABLE_FULL);
			return;
		}
		struct port_counts *counts = counts_for(&key);
		if (!counts) {
			bpf_map_delete_elem(&sw_socks, &addr);
			return;
		}
		__sync_fetch_and_add(&counts->active, 1);
		__sync_fetch_and_add(&counts->opened, 1);
	} else if (newstate == TCP_CLOSE && oldstate != TCP_CLOSE) {
		__u16 num = 0;
		void *pprev = 0;
		if (typed) {
			num = sk->__sk_common.skc_num;
			pprev = sk->__sk_common.skc_node.pprev;
		} else {
			READ(num, sk->__sk_common.skc_num);
			READ(pprev, sk->__sk_common.skc_node.pprev);
		}
		if (oldstate == TCP_SYN_SENT && num == 0) {
			/* Read through the address in both programs: inet_sport lies beyond
			 * struct sock, where a BTF-typed sock pointer may not be loaded from. */
			__be16 sport = 0;
			READ(sport, ((struct inet_sock *)sk)->inet_sport);
			if (sport == 0)
				count_failure(sk, typed);
		}
		int to_time_wait = (oldstate == TCP_FIN_WAIT1 || oldstate == TCP_FIN_WAIT2 || oldstate == TCP_CLOSING) && !pprev;
		untrack_sock(addr, to_time_wait);
	}
	if (newstate == TCP_CLOSE_WAIT) {
		struct close_wait_val val;
		__builtin_memset(&val, 0, sizeof(val));
		if (typed ? key_of(sk, &val.key, IPPROTO_TCP) : key_of_addr(sk, &val.key, IPPROTO_TCP))
			return;
		val.since = bpf_ktime_get_ns() / 1000000000ULL;
		struct cgroup *cgroup = 0;
		struct kernfs_node *kn = 0;
		READ(val.lport, sk->__sk_common.skc_num);
		READ(cgroup, sk->sk_cgrp_data.cgroup);
		READ(kn, cgroup->kn);
		READ(val.cgroup, kn->id);
		if (bpf_map_update_elem(&sw_close_wait, &addr, &val, BPF_ANY))
			stat_inc(STAT_CLOSE_WAIT_TABLE_FULL);
	} else if (oldstate == TCP_CLOSE_WAIT) {
		bpf_map_delete_elem(&sw_close_wait, &addr);
	}
}

SEC("tp_btf/inet_sock_set_state")
int sockwatch_set_state(unsigned long long *ctx)
{
	struct sock *sk = (struct sock *)ctx[0];
	if (sk && sk->sk_protocol == IPPROTO_TCP)
		on_state(sk, (int)ctx[1], (int)ctx[2], 1);
	return 0;
}

/* The classic tracepoint's record (events/sock/inet_sock_set_state/format), relocated by
 * CO-RE against the kernel's own trace_event_raw_ type. For kernels that refuse tracing
 * programs (tp_btf) but run tracepoint ones. */
struct trace_event_raw_inet_sock_set_state {
	const void *skaddr;
	int oldstate;
	int newstate;
	__u16 protocol;
} __attribute__((preserve_access_index));

SEC("tracepoint/sock/inet_sock_set_state")
int sockwatch_set_state_tp(struct trace_event_raw_inet_sock_set_state *ctx)
{
	struct sock *sk = (struct sock *)ctx->skaddr;
	if (sk && ctx->protocol == IPPROTO_TCP)
		on_state(sk, ctx->oldstate, ctx->newstate, 0);
	return 0;
}

/* Writes one record per socket still in CLOSE_WAIT, with the inode of its file read now
 * (a socket whose FIN came while it waited in the accept queue has one once accepted). */
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
	rec.key = val->key;
	rec.lport = val->lport;
	rec.since = val->since;
	rec.cgroup = val->cgroup;
	/* No socket or file yet (still in the accept queue): the reads fail, inode stays 0. */
	struct socket *socket = 0;
	struct file *file = 0;
	struct inode *inode = 0;
	READ(socket, sk->sk_socket);
	READ(file, socket->file);
	READ(inode, file->f_inode);
	READ(rec.inode, inode->i_ino);
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

/* ---- bind()/connect() failing for want of a port ----
 *
 * TCP connect() is seen by inet_sock_set_state. The others fail before any socket state
 * changes, so they are watched at the syscall tracepoints (kprobes and fexit are not
 * available): the sys_enter program stashes, per thread, the fd and the address asked
 * for; the sys_exit program takes the entry back and, only when the call failed with the
 * exhaustion errno, finds the socket through the task's file table to check its protocol
 * and read its namespace. Errnos, measured on 6.18 with the range exhausted:
 *   bind() to port 0 (TCP or UDP)        EADDRINUSE (inet_csk_get_port/udp_lib_get_port)
 *   UDP connect()                        EAGAIN (inet_autobind failing)
 * An explicit port that is taken is EADDRINUSE too, but is not exhaustion: bind() is
 * followed only for port 0. EAGAIN is also what a full send buffer of a non-blocking
 * socket returns; a socket that failed autobind still has no port (skc_num == 0), which
 * tells them apart. sendto()/sendmsg() autobind failures are not watched: their
 * tracepoints fire for every datagram sent to an address (about 0.9 µs each, measured),
 * too much for UDP servers that reply that way; an exhausted range still shows as the
 * namespace's UDP utilisation. */

/* The syscall tracepoints' records (events/syscalls/sys_{enter,exit}_* /format). */
struct syscall_enter {
	__u64 common;
	int nr;
	__u32 pad;
	__u64 args[6];
};

struct syscall_exit {
	__u64 common;
	int nr;
	__u32 pad;
	__s64 ret;
};

/* The first bytes of a sockaddr_in / sockaddr_in6. */
struct sockaddr_head {
	__u16 family;
	__be16 port;
	__be32 v4; /* sin_addr; sin6_flowinfo for IPv6 */
};

#define S_IFMT 0170000
#define S_IFSOCK 0140000

/* Stashes the call for its exit if `uaddr` is an inet address (and port 0 for bind). */
static __always_inline void stash(__u64 fd, const void *uaddr, __u16 call)
{
	struct sockaddr_head head;
	if (!uaddr || bpf_probe_read_user(&head, sizeof(head), uaddr))
		return;
	if (head.family != AF_INET && head.family != AF_INET6)
		return;
	__u16 port = __builtin_bswap16(head.port);
	if (call == CALL_BIND && port != 0)
		return; /* an explicit port: EADDRINUSE would mean taken, not exhausted */
	struct pending pending;
	__builtin_memset(&pending, 0, sizeof(pending));
	pending.fd = fd;
	pending.call = call;
	pending.family = head.family;
	pending.port = port;
	if (head.family == AF_INET)
		v4_mapped(pending.addr, head.v4);
	else if (bpf_probe_read_user(pending.addr, sizeof(pending.addr), (const __u8 *)uaddr + 8))
		return;
	__u64 id = bpf_get_current_pid_tgid();
	if (bpf_map_update_elem(&sw_pending, &id, &pending, BPF_ANY))
		stat_inc(STAT_PENDING_TABLE_FULL);
}

/* The sock behind the current task's `fd`, or 0: every read fault-safe and bounded by
 * the table's size, the file checked to be a socket. */
static __always_inline struct sock *sock_of_fd(__u32 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct files_struct *files = 0;
	struct fdtable *fdt = 0;
	struct file **fds = 0;
	struct file *file = 0;
	struct inode *inode = 0;
	struct socket *socket = 0;
	struct sock *sk = 0;
	unsigned int max_fds = 0;
	unsigned short mode = 0;
	READ(files, task->files);
	READ(fdt, files->fdt);
	READ(max_fds, fdt->max_fds);
	if (fd >= max_fds)
		return 0;
	READ(fds, fdt->fd);
	if (!fds || bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return 0;
	READ(inode, file->f_inode);
	READ(mode, inode->i_mode);
	if ((mode & S_IFMT) != S_IFSOCK)
		return 0;
	READ(socket, file->private_data);
	READ(sk, socket->sk);
	return sk;
}

/* The exit of `call`: counts a failure if it returned the exhaustion errno; always drops
 * the thread's entry. */
static __always_inline void finish(struct syscall_exit *ctx, __u16 call)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct pending *entry = bpf_map_lookup_elem(&sw_pending, &id);
	if (!entry)
		return;
	struct pending pending = *entry;
	bpf_map_delete_elem(&sw_pending, &id);
	int err = call == CALL_BIND ? EADDRINUSE : EAGAIN;
	if (pending.call != call || ctx->ret != -err)
		return;
	struct sock *sk = sock_of_fd(pending.fd);
	if (!sk)
		return;
	unsigned short family = 0;
	__u16 protocol = 0, num = 0;
	struct net *net = 0;
	READ(family, sk->__sk_common.skc_family);
	READ(protocol, sk->sk_protocol);
	READ(num, sk->__sk_common.skc_num);
	if (family != AF_INET && family != AF_INET6)
		return;
	if (call == CALL_BIND ? (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP) : (protocol != IPPROTO_UDP || num))
		return;
	struct fail_key fail;
	__builtin_memset(&fail, 0, sizeof(fail));
	READ(net, sk->__sk_common.skc_net.net);
	READ(fail.key.netns, net->ns.inum);
	fail.key.proto = protocol;
	fail.key.family = pending.family;
	if (call == CALL_BIND) {
		__builtin_memcpy(fail.key.laddr, pending.addr, 16);
		if (pending.family == AF_INET)
			v4_mapped(fail.key.raddr, 0);
	} else {
		/* The socket has no port, so no local address either (bind() would have set
		 * both): unspecified, IPv4-mapped when the address asked for is IPv4. */
		if (pending.family == AF_INET)
			v4_mapped(fail.key.laddr, 0);
		__builtin_memcpy(fail.key.raddr, pending.addr, 16);
		fail.key.rport = pending.port;
	}
	fail.call = call;
	fail.err = err;
	count_fail_key(&fail);
}

SEC("tracepoint/syscalls/sys_enter_bind")
int sockwatch_bind_enter(struct syscall_enter *ctx)
{
	stash(ctx->args[0], (const void *)ctx->args[1], CALL_BIND);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_bind")
int sockwatch_bind_exit(struct syscall_exit *ctx)
{
	finish(ctx, CALL_BIND);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_connect")
int sockwatch_connect_enter(struct syscall_enter *ctx)
{
	stash(ctx->args[0], (const void *)ctx->args[1], CALL_CONNECT);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_connect")
int sockwatch_connect_exit(struct syscall_exit *ctx)
{
	finish(ctx, CALL_CONNECT);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
