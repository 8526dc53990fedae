// Katran's XDP balancer measured by Spillway's method (`cargo xtask bench --part paths`):
// BPF_PROG_TEST_RUN with repeat=1 per call, the kernel-reported duration, the thread pinned
// to one CPU, cases alternating in chunks, per repetition the mean, then the median over
// repetitions; ratios to a `return XDP_TX;` floor. `-o FILE` writes them as the `case ratio`
// lines `--katran FILE` reads. Built by `build.sh` (README.md there).
//
// Maps are set up as Katran's userspace (katran/lib/KatranLb.cpp) does for one VIP with 10
// reals, with its own headers for the maps' layouts.
#define _GNU_SOURCE
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <getopt.h>
#include <linux/bpf.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

// Katran's own constants and map layouts, from its checkout (build.sh: -I KATRAN_SRC).
#include "katran/lib/bpf/balancer_consts.h"
#include "katran/lib/bpf/balancer_structs.h"

#define NREALS 10
#define CHUNK 10000
#define HEADROOM 256
#define FRAME_LEN 54

static const uint8_t GW_MAC[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
static const uint8_t LOCAL_MAC[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x02};
static const uint8_t CLIENT_MAC[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x03};

#define DIE(...) do { fprintf(stderr, "error: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static int ncpus;
static int cpu = 1;
static int stats_fd, lru_fd_measured;
static uint32_t real_addrs[NREALS + 1]; // index 1..10, network order

// ---------- frames ----------
static uint16_t csum16(const uint8_t* p, int len, uint32_t sum) {
  for (int i = 0; i + 1 < len; i += 2) sum += (p[i] << 8) | p[i + 1];
  if (len & 1) sum += p[len - 1] << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return (uint16_t)~sum;
}

// src/dst in host order; flags: TCP flags byte
static void make_frame(uint8_t* f, uint32_t src, uint16_t sport, uint32_t dst, uint16_t dport, uint8_t flags) {
  memset(f, 0, FRAME_LEN);
  memcpy(f, LOCAL_MAC, 6);
  memcpy(f + 6, CLIENT_MAC, 6);
  f[12] = 0x08; f[13] = 0x00;
  uint8_t* ip = f + 14;
  ip[0] = 0x45; ip[1] = 0; ip[2] = 0; ip[3] = 40; // tot_len 40
  ip[4] = 0; ip[5] = 0; ip[6] = 0x40; ip[7] = 0;  // id 0, DF
  ip[8] = 64; ip[9] = 6;
  uint32_t s = htonl(src), d = htonl(dst);
  memcpy(ip + 12, &s, 4); memcpy(ip + 16, &d, 4);
  uint16_t c = csum16(ip, 20, 0);
  ip[10] = c >> 8; ip[11] = c & 0xff;
  uint8_t* t = ip + 20;
  t[0] = sport >> 8; t[1] = sport & 0xff; t[2] = dport >> 8; t[3] = dport & 0xff;
  t[4] = 0; t[5] = 0; t[6] = 0x10; t[7] = 0x00;           // seq
  if (flags & 0x10) { t[8] = 0; t[9] = 0; t[10] = 0x20; t[11] = 0; } // ack
  t[12] = 5 << 4; t[13] = flags; t[14] = 0xff; t[15] = 0xff; // window
  // TCP checksum over pseudo header
  uint8_t ph[12];
  memcpy(ph, ip + 12, 8); ph[8] = 0; ph[9] = 6; ph[10] = 0; ph[11] = 20;
  uint32_t sum = 0;
  for (int i = 0; i < 12; i += 2) sum += (ph[i] << 8) | ph[i + 1];
  c = csum16(t, 20, sum);
  t[16] = c >> 8; t[17] = c & 0xff;
}

static struct flow_key frame_key(const uint8_t* f) {
  struct flow_key k;
  memset(&k, 0, sizeof(k));
  memcpy(&k.src, f + 14 + 12, 4);
  memcpy(&k.dst, f + 14 + 16, 4);
  memcpy(&k.port16[0], f + 34, 2);
  memcpy(&k.port16[1], f + 36, 2);
  k.proto = 6;
  return k;
}

// ---------- per-cpu stats ----------
static struct lb_stats stat_get(uint32_t key) {
  struct lb_stats v[ncpus];
  if (bpf_map_lookup_elem(stats_fd, &key, v)) DIE("stats lookup %u: %s", key, strerror(errno));
  return v[cpu];
}
static void stat_set(uint32_t key, uint64_t v1, uint64_t v2) {
  struct lb_stats v[ncpus];
  if (bpf_map_lookup_elem(stats_fd, &key, v)) DIE("stats lookup %u: %s", key, strerror(errno));
  v[cpu].v1 = v1; v[cpu].v2 = v2;
  if (bpf_map_update_elem(stats_fd, &key, v, BPF_ANY)) DIE("stats update %u: %s", key, strerror(errno));
}
static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
// Katran's flood limiter (is_under_flood): v1 new conns in this quantum, v2 quantum start.
static void limiter_reset(void) { stat_set(MAX_VIPS + NEW_CONN_RATE_CNTR, 0, mono_ns()); }
static void limiter_trip(void) { stat_set(MAX_VIPS + NEW_CONN_RATE_CNTR, 1ull << 40, mono_ns()); }

// ---------- test run ----------
static uint32_t ifindex = 1;
static int run(int prog_fd, const uint8_t* frame, uint8_t* out, uint32_t* out_len, uint32_t* dur) {
  uint32_t md[6] = {0, FRAME_LEN, 0, ifindex, 0, 0};
  LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = frame, .data_size_in = FRAME_LEN, .data_out = out,
              .data_size_out = FRAME_LEN + HEADROOM, .ctx_in = md, .ctx_size_in = sizeof(md), .repeat = 1);
  int err = bpf_prog_test_run_opts(prog_fd, &o);
  if (err) DIE("test_run: %s", strerror(errno));
  *out_len = o.data_size_out;
  *dur = o.duration;
  return o.retval;
}

// Checks Katran's IPIP output: new eth to the gateway, outer IPv4 proto 4 to a real, valid
// csum, inner packet byte-identical. Returns real index or dies.
static int check_ipip(const char* name, const uint8_t* in, const uint8_t* out, uint32_t len) {
  if (len != FRAME_LEN + 20) DIE("%s: output length %u, expected %u", name, len, FRAME_LEN + 20);
  if (memcmp(out, GW_MAC, 6)) DIE("%s: outer dst MAC is not the gateway's", name);
  if (out[12] != 0x08 || out[13] != 0x00) DIE("%s: outer ethertype", name);
  const uint8_t* ip = out + 14;
  if (ip[0] != 0x45) DIE("%s: outer IPv4 version/ihl 0x%02x", name, ip[0]);
  if (ip[9] != 4) DIE("%s: outer protocol %u, expected 4 (IPIP)", name, ip[9]);
  if (((ip[2] << 8) | ip[3]) != 60) DIE("%s: outer tot_len %u", name, (ip[2] << 8) | ip[3]);
  if (csum16(ip, 20, 0) != 0) DIE("%s: outer IPv4 checksum invalid", name);
  uint32_t d;
  memcpy(&d, ip + 16, 4);
  int idx = 0;
  for (int i = 1; i <= NREALS; i++) if (real_addrs[i] == d) idx = i;
  if (!idx) DIE("%s: outer dst %08x is not a real", name, ntohl(d));
  if (memcmp(out + 34, in + 14, FRAME_LEN - 14)) DIE("%s: inner packet differs", name);
  return idx;
}

// ---------- ch ring: Maglev (Eisenbud et al.) ----------
static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static void maglev_fill(uint32_t* ring) {
  uint32_t offset[NREALS], skip[NREALS], next[NREALS];
  for (int i = 0; i < NREALS; i++) {
    offset[i] = splitmix(real_addrs[i + 1] ^ 0x1234) % RING_SIZE;
    skip[i] = splitmix(real_addrs[i + 1] ^ 0x5678) % (RING_SIZE - 1) + 1;
    next[i] = 0;
  }
  for (int i = 0; i < RING_SIZE; i++) ring[i] = 0;
  int filled = 0;
  while (1) {
    for (int i = 0; i < NREALS; i++) {
      uint32_t c;
      do { c = (offset[i] + (uint64_t)next[i] * skip[i]) % RING_SIZE; next[i]++; } while (ring[c]);
      ring[c] = i + 1; // real ids start at 1 as Katran's
      if (++filled == RING_SIZE) return;
    }
  }
}

// ---------- cases ----------
enum { C_FLOOR, C_HIT, C_NEW, C_SYNSAME, C_NONVIP, C_RATE, NCASES };
static const char* NAMES[NCASES] = {"floor", "table_hit", "new_flow", "syn_same_tuple", "non_vip_pass", "rate_limited_drop"};
static const uint32_t VIP = 0x0AC80101; // 10.200.1.1
static const uint32_t NONVIP = 0x0AC80909; // 10.200.9.9
static const uint32_t CLIENT = 0xC0A80A14; // 192.168.10.20

// unique sources: new_flow from 172.16.0.0/12-ish, rate_limited from 172.20.0.0/14
static void new_source(uint8_t* f, uint32_t base, uint32_t n) {
  make_frame(f, base + (n >> 14), 1024 + (n & 0x3fff), VIP, 80, 0x02);
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  long calls = 100000, reps = 5;
  const char* outfile = NULL;
  const char* katran_obj = "target/katran/balancer.bpf.o";
  const char* floor_obj = "target/katran/floor.bpf.o";
  long lru_size = 4000000; // Katran default LruSize 8M / 2 forwarding cores
  int lru_flags = 0;      // KatranLb::createLruMap passes flags 0 (no NUMA)
  static struct option lo[] = {{"calls", 1, 0, 'c'}, {"reps", 1, 0, 'r'}, {"out", 1, 0, 'o'},
                               {"cpu", 1, 0, 'C'}, {"katran", 1, 0, 'k'}, {"floor", 1, 0, 'f'},
                               {"lru-size", 1, 0, 'l'}, {"no-common-lru", 0, 0, 'N'},
                               {"ifindex", 1, 0, 'i'}, {"help", 0, 0, 'h'}, {0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "c:r:o:C:k:f:l:Ni:h", lo, NULL)) != -1) {
    switch (opt) {
      case 'c': calls = atol(optarg); break;
      case 'r': reps = atol(optarg); break;
      case 'o': outfile = optarg; break;
      case 'C': cpu = atoi(optarg); break;
      case 'k': katran_obj = optarg; break;
      case 'f': floor_obj = optarg; break;
      case 'l': lru_size = atol(optarg); break;
      case 'N': lru_flags |= BPF_F_NO_COMMON_LRU; break;
      case 'i': ifindex = atoi(optarg); break;
      default:
        fprintf(stderr,
                "usage: %s [-c CALLS] [-r REPS] [-o FILE] [--cpu N] [--katran OBJ] [--floor OBJ]\n"
                "          [--lru-size N] [--no-common-lru] [--ifindex N]\n", argv[0]);
        return opt == 'h' ? 0 : 2;
    }
  }
  if (calls <= 0 || reps <= 0) DIE("calls and reps must be positive");
  ncpus = libbpf_num_possible_cpus();
  if (cpu >= ncpus) DIE("cpu %d >= %d possible", cpu, ncpus);

  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set)) DIE("sched_setaffinity: %s", strerror(errno));

  // Per-core LRUs, as KatranLb::initLrus with forwarding cores 0..ncpus-1.
  int lru_fds[MAX_SUPPORTED_CPUS];
  for (int c = 0; c < ncpus && c < MAX_SUPPORTED_CPUS; c++) {
    char name[16];
    snprintf(name, sizeof(name), "katran_lru%d", c);
    LIBBPF_OPTS(bpf_map_create_opts, mo, .map_flags = lru_flags);
    lru_fds[c] = bpf_map_create(BPF_MAP_TYPE_LRU_HASH, name, sizeof(struct flow_key),
                                sizeof(struct real_pos_lru), lru_size, &mo);
    if (lru_fds[c] < 0) DIE("creating LRU for cpu %d: %s", c, strerror(errno));
  }
  lru_fd_measured = lru_fds[cpu];

  // Load Katran.
  struct bpf_object* obj = bpf_object__open_file(katran_obj, NULL);
  if (!obj) DIE("open %s: %s", katran_obj, strerror(errno));
  struct bpf_map* lru_mapping = bpf_object__find_map_by_name(obj, "lru_mapping");
  if (!lru_mapping) DIE("no lru_mapping");
  if (bpf_map__set_inner_map_fd(lru_mapping, lru_fds[0])) DIE("set_inner_map_fd");
  if (bpf_object__load(obj)) DIE("loading Katran: %s", strerror(errno));
  struct bpf_program* prog = bpf_object__find_program_by_name(obj, "balancer_ingress");
  if (!prog) DIE("no balancer_ingress");
  int kfd = bpf_program__fd(prog);
  struct bpf_prog_info info;
  memset(&info, 0, sizeof(info));
  uint32_t ilen = sizeof(info);
  if (bpf_obj_get_info_by_fd(kfd, &info, &ilen)) DIE("prog info");
  printf("# katran: %s, verified_insns %u, xlated %u insns\n", katran_obj, info.verified_insns,
         info.xlated_prog_len / 8);

  struct bpf_object* fobj = bpf_object__open_file(floor_obj, NULL);
  if (!fobj || bpf_object__load(fobj)) DIE("loading floor %s", floor_obj);
  int ffd = bpf_program__fd(bpf_object__find_program_by_name(fobj, "floor_tx"));

#define MAPFD(n) ({ int _f = bpf_object__find_map_fd_by_name(obj, n); if (_f < 0) DIE("no map " n); _f; })
  stats_fd = MAPFD("stats");
  int lru_mapping_fd = MAPFD("lru_mapping");
  for (int c = 0; c < ncpus && c < MAX_SUPPORTED_CPUS; c++) {
    uint32_t k = c;
    if (bpf_map_update_elem(lru_mapping_fd, &k, &lru_fds[c], BPF_ANY)) DIE("attach lru %d: %s", c, strerror(errno));
  }
  // ctl_array: default gateway MAC at kMacAddrPos 0.
  {
    struct ctl_value v = {0};
    memcpy(v.mac, GW_MAC, 6);
    uint32_t k = 0;
    if (bpf_map_update_elem(MAPFD("ctl_array"), &k, &v, BPF_ANY)) DIE("ctl_array");
  }
  // vip_map: 10.200.1.1:80 TCP, vip_num 0, no flags.
  {
    struct vip_definition k;
    memset(&k, 0, sizeof(k));
    k.vip = htonl(VIP);
    k.port = htons(80);
    k.proto = 6;
    struct vip_meta m = {.flags = 0, .vip_num = 0};
    if (bpf_map_update_elem(MAPFD("vip_map"), &k, &m, BPF_ANY)) DIE("vip_map");
  }
  // reals: ids 1..10 -> 10.0.0.1..10.
  {
    int fd = MAPFD("reals");
    for (uint32_t i = 1; i <= NREALS; i++) {
      struct real_definition r;
      memset(&r, 0, sizeof(r));
      real_addrs[i] = r.dst = htonl(0x0A000000 + i);
      if (bpf_map_update_elem(fd, &i, &r, BPF_ANY)) DIE("reals");
    }
  }
  // ch_rings for vip_num 0.
  uint32_t* ring = malloc(sizeof(uint32_t) * RING_SIZE);
  maglev_fill(ring);
  {
    int fd = MAPFD("ch_rings");
    uint32_t keys_n = RING_SIZE;
    uint32_t* keys = malloc(sizeof(uint32_t) * RING_SIZE);
    for (uint32_t i = 0; i < RING_SIZE; i++) keys[i] = i;
    LIBBPF_OPTS(bpf_map_batch_opts, bo);
    if (bpf_map_update_batch(fd, keys, ring, &keys_n, &bo) || keys_n != RING_SIZE) {
      for (uint32_t i = 0; i < RING_SIZE; i++)
        if (bpf_map_update_elem(fd, &i, &ring[i], BPF_ANY)) DIE("ch_rings");
    }
    free(keys);
    int cnt[NREALS + 1] = {0};
    for (uint32_t i = 0; i < RING_SIZE; i++) cnt[ring[i]]++;
    printf("# ch ring (Maglev): slots per real:");
    for (int i = 1; i <= NREALS; i++) printf(" %d", cnt[i]);
    printf("\n");
  }

  uint8_t out[FRAME_LEN + HEADROOM];
  uint32_t olen, dur;
  uint8_t ack[FRAME_LEN], syn[FRAME_LEN], nonvip[FRAME_LEN], f[FRAME_LEN];
  make_frame(ack, CLIENT, 40000, VIP, 80, 0x10);
  make_frame(syn, CLIENT, 40000, VIP, 80, 0x02);
  make_frame(nonvip, CLIENT, 40000, NONVIP, 80, 0x02);

  // Establish the flow: SYN once.
  limiter_reset();
  int ret = run(kfd, syn, out, &olen, &dur);
  if (ret != XDP_TX) DIE("SYN: action %d", ret);
  int syn_real = check_ipip("syn", syn, out, olen);
  {
    struct flow_key k = frame_key(syn);
    struct real_pos_lru v;
    if (bpf_map_lookup_elem(lru_fd_measured, &k, &v)) DIE("SYN did not insert into cpu %d's LRU", cpu);
    if ((int)v.pos != syn_real) DIE("LRU pos %u != real %d", v.pos, syn_real);
  }
  ret = run(kfd, ack, out, &olen, &dur);
  if (ret != XDP_TX || check_ipip("ack", ack, out, olen) != syn_real) DIE("ACK not to the SYN's real");
  ret = run(ffd, ack, out, &olen, &dur);
  if (ret != XDP_TX) DIE("floor: %d", ret);
  ret = run(kfd, nonvip, out, &olen, &dur);
  if (ret != XDP_PASS) DIE("non-vip: %d", ret);
  printf("# flow 192.168.10.20:40000 -> 10.200.1.1:80 maps to real %d (10.0.0.%d)\n", syn_real, syn_real);

  double per_rep[NCASES][reps];
  uint32_t new_n = 0, rate_n = 0;
  const uint32_t NEW_BASE = 0xAC100000, RATE_BASE = 0xAC140000; // 172.16/172.20
  struct flow_key* inserted = malloc(sizeof(struct flow_key) * calls);
  uint64_t totals_miss_hit = 0, totals_nonsyn_miss = 0;

  for (long r = 0; r < reps; r++) {
    uint64_t ns[NCASES] = {0};
    long n_inserted = 0;
    for (long done = 0; done < calls; done += CHUNK) {
      long chunk = calls - done < CHUNK ? calls - done : CHUNK;
      for (int c = 0; c < NCASES; c++) {
        struct lb_stats miss0 = stat_get(MAX_VIPS + LRU_MISS_CNTR);
        struct lb_stats lru0 = stat_get(MAX_VIPS + LRU_CNTRS);
        struct lb_stats fb0 = stat_get(MAX_VIPS + FALLBACK_LRU_CNTR);
        if (c == C_NEW || c == C_SYNSAME) limiter_reset();
        if (c == C_RATE) limiter_trip();
        uint32_t rate_first = rate_n;
        for (long i = 0; i < chunk; i++) {
          const uint8_t* in;
          int prog = kfd, want = XDP_TX;
          switch (c) {
            case C_FLOOR: in = ack; prog = ffd; break;
            case C_HIT: in = ack; break;
            case C_NEW: new_source(f, NEW_BASE, new_n++); in = f; break;
            case C_SYNSAME: in = syn; break;
            case C_NONVIP: in = nonvip; want = XDP_PASS; break;
            default: new_source(f, RATE_BASE, rate_n++); in = f; break;
          }
          ret = run(prog, in, out, &olen, &dur);
          if (ret != want) DIE("%s: action %d, expected %d", NAMES[c], ret, want);
          ns[c] += dur;
          switch (c) {
            case C_FLOOR: break;
            case C_NONVIP:
              if (olen != FRAME_LEN || memcmp(out, in, FRAME_LEN)) DIE("non_vip_pass: frame changed");
              break;
            case C_HIT: case C_SYNSAME:
              if (check_ipip(NAMES[c], in, out, olen) != syn_real) DIE("%s: not the flow's real", NAMES[c]);
              break;
            case C_NEW:
              check_ipip(NAMES[c], in, out, olen);
              inserted[n_inserted++] = frame_key(in);
              break;
            default: check_ipip(NAMES[c], in, out, olen); break;
          }
        }
        struct lb_stats miss1 = stat_get(MAX_VIPS + LRU_MISS_CNTR);
        struct lb_stats lru1 = stat_get(MAX_VIPS + LRU_CNTRS);
        struct lb_stats fb1 = stat_get(MAX_VIPS + FALLBACK_LRU_CNTR);
        uint64_t syn_miss = miss1.v1 - miss0.v1, nonsyn_miss = miss1.v2 - miss0.v2;
        uint64_t total = lru1.v1 - lru0.v1, misses = lru1.v2 - lru0.v2;
        if (fb1.v1 != fb0.v1) DIE("%s: fallback LRU used (lru_mapping not found for cpu)", NAMES[c]);
        uint64_t want_total = (c == C_FLOOR || c == C_NONVIP) ? 0 : chunk;
        uint64_t want_miss = (c == C_NEW || c == C_SYNSAME || c == C_RATE) ? chunk : 0;
        if (total != want_total) DIE("%s: LRU_CNTRS total %lu, expected %lu", NAMES[c], total, want_total);
        if (misses != want_miss || syn_miss != want_miss || nonsyn_miss != 0)
          DIE("%s: misses %lu (syn %lu, non-syn %lu), expected %lu", NAMES[c], misses, syn_miss, nonsyn_miss, want_miss);
        if (c == C_HIT) totals_miss_hit += misses;
        totals_nonsyn_miss += nonsyn_miss;
        if (c == C_NEW || c == C_SYNSAME) {
          struct lb_stats cr = stat_get(MAX_VIPS + NEW_CONN_RATE_CNTR);
          if (cr.v1 != (uint64_t)chunk) DIE("%s: conn-rate counter %llu after %ld SYNs (a quantum rolled or limiter hit)", NAMES[c], (unsigned long long)cr.v1, chunk);
        }
        if (c == C_RATE) {
          struct lb_stats cr = stat_get(MAX_VIPS + NEW_CONN_RATE_CNTR);
          if (cr.v1 <= MAX_CONN_RATE) DIE("rate_limited_drop: limiter not tripped (%llu)", (unsigned long long)cr.v1);
          for (uint32_t n = rate_first; n < rate_n; n++) {
            new_source(f, RATE_BASE, n);
            struct flow_key k = frame_key(f);
            struct real_pos_lru v;
            if (bpf_map_lookup_elem(lru_fd_measured, &k, &v) == 0) DIE("rate_limited_drop: flow was inserted");
          }
        }
      }
    }
    // Every new flow was inserted into cpu's LRU; remove them so each rep starts alike.
    for (long i = 0; i < n_inserted; i++) {
      struct real_pos_lru v;
      if (bpf_map_lookup_elem(lru_fd_measured, &inserted[i], &v)) DIE("new_flow %ld not in the LRU", i);
      if (bpf_map_delete_elem(lru_fd_measured, &inserted[i])) DIE("deleting new flow");
    }
    {
      struct flow_key k = frame_key(syn);
      struct real_pos_lru v;
      if (bpf_map_lookup_elem(lru_fd_measured, &k, &v)) DIE("established flow evicted");
    }
    for (int c = 0; c < NCASES; c++) per_rep[c][r] = (double)ns[c] / calls;
    fprintf(stderr, "rep %ld:", r + 1);
    for (int c = 0; c < NCASES; c++) fprintf(stderr, " %s %.1f", NAMES[c], per_rep[c][r]);
    fprintf(stderr, "\n");
  }

  double med[NCASES];
  for (int c = 0; c < NCASES; c++) {
    double tmp[reps];
    memcpy(tmp, per_rep[c], sizeof(tmp));
    qsort(tmp, reps, sizeof(double), cmp_d);
    med[c] = reps % 2 ? tmp[reps / 2] : (tmp[reps / 2 - 1] + tmp[reps / 2]) / 2;
  }
  printf("# cpu %d, %ld calls x %ld reps per case, chunks of %d, LRU %ld entries/cpu flags 0x%x\n", cpu, calls,
         reps, CHUNK, lru_size, lru_flags);
  printf("# checks: table_hit LRU misses %lu; non-SYN misses %lu; new_flow all missed and inserted; "
         "rate_limited_drop all missed, none inserted\n", totals_miss_hit, totals_nonsyn_miss);
  printf("%-18s %10s %8s\n", "case", "ns", "ratio");
  for (int c = 0; c < NCASES; c++) printf("%-18s %10.1f %8.2f\n", NAMES[c], med[c], med[c] / med[C_FLOOR]);
  if (outfile) {
    FILE* o = fopen(outfile, "w");
    if (!o) DIE("open %s: %s", outfile, strerror(errno));
    fprintf(o, "# Katran %s (verified_insns %u) by xtask/katran/runner.c, cpu %d, %ld calls x %ld reps, floor %.1f ns\n",
            katran_obj, info.verified_insns, cpu, calls, reps, med[C_FLOOR]);
    for (int c = 1; c < NCASES; c++) fprintf(o, "%s %.2f\n", NAMES[c], med[c] / med[C_FLOOR]);
    fclose(o);
    printf("# wrote %s\n", outfile);
  }
  return 0;
}
