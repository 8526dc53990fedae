// SPDX-License-Identifier: GPL-2.0
//
// AES-128-ECB for the balancer's QUIC program (xdp-ebpf/src/bin/lb/quic_crypto.rs): one block
// encrypted or decrypted with the key of one (VIP, config id), through the kernel's crypto
// kfuncs (kernel/bpf/crypto.c: bpf_crypto_encrypt/decrypt are allowed in XDP programs).
//
// Why C: the kfuncs are resolved by the loader from the BTF of their extern declarations, and
// the context is a referenced kptr, a BTF type tag on the map value's field; rustc emits
// neither. This file is compiled to LLVM bitcode (xdp-ebpf/build.rs) and linked into the
// balancer's object by bpf-linker.
//
// The contexts are made by a syscall program (dataplane/src/quic_keys.rs) that calls
// bpf_crypto_ctx_create, which XDP programs may not call, and bpf_kptr_xchg's the context
// into its slot of spw_quic_keys. A key's octets are never in a map: only the kernel's
// context holds them.

typedef unsigned char __u8;
typedef unsigned int __u32;
typedef unsigned long long __u64;

// Defined, not only declared: the loader (aya) checks an extern kfunc's signature against
// the kernel's, kind by kind, and a forward declaration is not the kernel's struct. Its
// fields do not matter: the program never reads them, and a kptr's type is found by name.
struct bpf_crypto_ctx {
	int __opaque;
};
struct bpf_dynptr {
	__u64 __opaque[2];
} __attribute__((aligned(8)));

#define __ksym __attribute__((section(".ksyms")))
#define __kptr __attribute__((btf_type_tag("kptr")))

extern int bpf_crypto_encrypt(struct bpf_crypto_ctx *ctx, const struct bpf_dynptr *src,
			      const struct bpf_dynptr *dst, const struct bpf_dynptr *siv__nullable) __ksym;
extern int bpf_crypto_decrypt(struct bpf_crypto_ctx *ctx, const struct bpf_dynptr *src,
			      const struct bpf_dynptr *dst, const struct bpf_dynptr *siv__nullable) __ksym;

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_dynptr_from_mem)(void *data, __u32 size, __u64 flags, struct bpf_dynptr *ptr) = (void *)197;

// One slot per (VIP id, config id): VIP id * 8 + config id. Its size is set by the loader
// (the balancer's --max-vips times 8).
struct quic_key {
	struct bpf_crypto_ctx __kptr *ctx;
};

struct {
	int (*type)[2 /* BPF_MAP_TYPE_ARRAY */];
	__u32 *key;
	struct quic_key *value;
	int (*max_entries)[512];
} spw_quic_keys __attribute__((section(".maps"), used));

// One AES block, a struct so the verifier knows the size behind the pointer.
struct spw_aes_block {
	__u8 octets[16];
};

// bpf_dynptr_from_mem takes map values, not the stack: each CPU's block in and out.
struct aes_scratch {
	struct spw_aes_block in;
	struct spw_aes_block out;
};

struct {
	int (*type)[6 /* BPF_MAP_TYPE_PERCPU_ARRAY */];
	__u32 *key;
	struct aes_scratch *value;
	int (*max_entries)[1];
} spw_quic_aes_buf __attribute__((section(".maps"), used));

// Encrypts (decrypt == 0) or decrypts `block` in place with the key in `slot`. 0, or a
// negative error: no key in the slot (-2), or what the kfunc returned. Not inlined: a
// subprogram's frame of its own for the dynptrs, which the crypt program's frame (the
// forwarding path's) has no room for.
__attribute__((noinline)) int spw_quic_aes(__u32 slot, __u32 decrypt, struct spw_aes_block *block)
{
	struct bpf_dynptr src, dst;
	struct quic_key *key = bpf_map_lookup_elem(&spw_quic_keys, &slot);
	__u32 zero = 0;
	struct aes_scratch *scratch = bpf_map_lookup_elem(&spw_quic_aes_buf, &zero);
	struct bpf_crypto_ctx *ctx;
	int err;

	if (!key || !scratch || !block)
		return -2;
	ctx = key->ctx;
	if (!ctx)
		return -2;
	scratch->in = *block;
	bpf_dynptr_from_mem(&scratch->in, sizeof(scratch->in), 0, &src);
	bpf_dynptr_from_mem(&scratch->out, sizeof(scratch->out), 0, &dst);
	err = decrypt ? bpf_crypto_decrypt(ctx, &src, &dst, 0) : bpf_crypto_encrypt(ctx, &src, &dst, 0);
	if (err)
		return err;
	*block = scratch->out;
	return 0;
}
