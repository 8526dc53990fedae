// SPDX-License-Identifier: GPL-2.0
//
// AES-128-ECB for the balancer's QUIC program (xdp-ebpf/src/bin/lb/quic_crypto.rs): one block
// encrypted or decrypted with the key of one (VIP, config id), through the kernel's crypto
// kfuncs (kernel/bpf/crypto.c: bpf_crypto_encrypt/decrypt are allowed in XDP programs).
//
// Why C: the kfuncs are resolved by the loader from the BTF of their extern declarations, and
// the context is a referenced kptr, a BTF type tag on the map value's field; rustc emits
// neither. This file is compiled to LLVM bitcode (xdp-ebpf/build.rs) and linked into the
// balancer's object by bpf-linker, which inlines spw_quic_aes into its Rust caller.
//
// The contexts are made by a syscall program (dataplane/src/quic_keys.rs) that calls
// bpf_crypto_ctx_create, which XDP programs may not call, and bpf_kptr_xchg's the context
// into its slot of spw_quic_keys. A key's octets are never in a map: only the kernel's
// context holds them.

typedef unsigned char __u8;
typedef unsigned int __u32;
typedef unsigned long long __u64;

struct bpf_crypto_ctx;
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

// Encrypts (decrypt == 0) or decrypts `block` in place with the key in `slot`. 0, or a
// negative error: no key in the slot (-2), or what the kfunc returned.
__attribute__((always_inline)) int spw_quic_aes(__u32 slot, __u32 decrypt, struct spw_aes_block *block)
{
	struct spw_aes_block out;
	struct bpf_dynptr src, dst;
	struct quic_key *key = bpf_map_lookup_elem(&spw_quic_keys, &slot);
	struct bpf_crypto_ctx *ctx;
	int err;

	if (!key)
		return -2;
	ctx = key->ctx;
	if (!ctx)
		return -2;
	bpf_dynptr_from_mem(block, sizeof(*block), 0, &src);
	bpf_dynptr_from_mem(&out, sizeof(out), 0, &dst);
	err = decrypt ? bpf_crypto_decrypt(ctx, &src, &dst, 0) : bpf_crypto_encrypt(ctx, &src, &dst, 0);
	if (err)
		return err;
	*block = out;
	return 0;
}
