/* A program written for the original Oncilla runtime's API (oncillamem.h),
 * run against a real local cluster by tests/tests/c_abi.rs: every function
 * of that API, every kind, one-sided reads and writes at several sizes and
 * offsets, copies between allocations of different kinds, and the answers
 * to bad input, each checked byte for byte. Node-0 (where it runs) is
 * smaller than a remote buffer, so remote buffers live on node-1.
 *
 * Prints one "ok ..." line per check group (a "skipped ..." line for GPU
 * kinds on a machine without a GPU) and exits non-zero on the first
 * failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oncillamem.h"

#define REM ((size_t)12 << 20)
#define LOC (((size_t)4 << 20) + 3)

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                  \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, " (last error %d: %s)\n", oncillamem_last_error(),    \
              oncillamem_last_error_message());                             \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static void fill(unsigned char *b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 31u + seed) % 251u);
}

static void *must_malloc(size_t n) {
  void *p = malloc(n);
  CHECK(p != NULL, "malloc(%zu)", n);
  return p;
}

static const char *kind_name(enum ocm_kind k) {
  switch (k) {
    case OCM_LOCAL_HOST: return "OCM_LOCAL_HOST";
    case OCM_LOCAL_RMA: return "OCM_LOCAL_RMA";
    case OCM_REMOTE_RMA: return "OCM_REMOTE_RMA";
    case OCM_LOCAL_RDMA: return "OCM_LOCAL_RDMA";
    case OCM_REMOTE_RDMA: return "OCM_REMOTE_RDMA";
    case OCM_LOCAL_GPU: return "OCM_LOCAL_GPU";
    case OCM_REMOTE_GPU: return "OCM_REMOTE_GPU";
    default: return "invalid";
  }
}

/* An allocation of `kind`; NULL (and a skip line) for a GPU kind where the
 * machine has none. */
static ocm_alloc_t make(enum ocm_kind kind, size_t local, size_t remote) {
  struct ocm_alloc_params ap = {local, remote, kind};
  ocm_alloc_t a = ocm_alloc(&ap);
  if (a == NULL && (kind == OCM_LOCAL_GPU || kind == OCM_REMOTE_GPU) &&
      oncillamem_last_error() == -12) {
    printf("skipped %s: %s\n", kind_name(kind), oncillamem_last_error_message());
    return NULL;
  }
  CHECK(a != NULL, "ocm_alloc(%s)", kind_name(kind));
  CHECK(ocm_alloc_kind(a) == kind, "ocm_alloc_kind(%s)", kind_name(kind));
  return a;
}

/* A remote kind: its queries, the whole buffer in and out, and one-sided
 * reads and writes at several sizes and offsets. */
static void remote_kind(enum ocm_kind kind) {
  ocm_alloc_t a = make(kind, LOC, REM);
  if (a == NULL) return;
  CHECK(ocm_is_remote(a), "ocm_is_remote(%s)", kind_name(kind));
  size_t sz = 0, len = 0;
  void *buf = NULL;
  CHECK(ocm_remote_sz(a, &sz) == 0 && sz == REM, "ocm_remote_sz: %zu", sz);
  CHECK(ocm_localbuf(a, &buf, &len) == 0 && buf != NULL && len == LOC,
        "ocm_localbuf: %p %zu", buf, len);
  unsigned char *local = buf;
  for (size_t i = 0; i < LOC; i += 4096) CHECK(local[i] == 0, "fresh local buffer at %zu", i);

  unsigned char *expect = must_malloc(REM), *got = must_malloc(REM);
  fill(expect, REM, 1);
  CHECK(ocm_copy_in(a, expect) == 0, "ocm_copy_in");
  CHECK(ocm_copy_out(got, a) == 0 && memcmp(got, expect, REM) == 0, "ocm_copy_out");

  size_t sizes[] = {1, 4095, 65536 + 7, 1u << 20, LOC};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s], loc_off = LOC - n, rem_off = REM - n - 13 * s;
    struct ocm_params rd = {loc_off, rem_off, 0, 0, n, 0};
    memset(local, 0, LOC);
    CHECK(ocm_copy_onesided(a, &rd) == 0, "one-sided read of %zu", n);
    CHECK(memcmp(local + loc_off, expect + rem_off, n) == 0, "one-sided read of %zu bytes", n);

    fill(local, LOC, (unsigned)(7 + s));
    size_t w_off = (s * 1234567u) % (REM - n);
    struct ocm_params wr = {0, w_off, 0, 0, n, 1};
    CHECK(ocm_copy_onesided(a, &wr) == 0, "one-sided write of %zu", n);
    memcpy(expect + w_off, local, n);
  }
  CHECK(ocm_copy_out(got, a) == 0 && memcmp(got, expect, REM) == 0,
        "the remote buffer after the one-sided writes");

  struct ocm_params past = {0, 0, 0, 0, LOC + 1, 0};
  CHECK(ocm_copy_onesided(a, &past) == -4, "more bytes than the local buffer holds");
  struct ocm_params beyond = {0, REM - 10, 0, 0, 11, 1};
  CHECK(ocm_copy_onesided(a, &beyond) == -4, "past the remote buffer's end");
  struct ocm_params flag = {0, 0, 0, 0, 1, 2};
  CHECK(ocm_copy_onesided(a, &flag) == -1, "op_flag 2");
  CHECK(ocm_free(a) == 0, "ocm_free(%s)", kind_name(kind));
  free(expect);
  free(got);
  printf("ok %s: one-sided reads and writes of 1 B to %zu B, whole buffer in and out\n",
         kind_name(kind), (size_t)LOC);
}

/* A local kind: one buffer, written through its pointer (host kinds) and
 * through ocm_copy_in, read back through ocm_copy_out. */
static void local_kind(enum ocm_kind kind) {
  ocm_alloc_t a = make(kind, LOC, 0);
  if (a == NULL) return;
  CHECK(!ocm_is_remote(a), "ocm_is_remote(%s)", kind_name(kind));
  size_t sz = 1, len = 0;
  void *buf = NULL;
  CHECK(ocm_remote_sz(a, &sz) == 0 && sz == 0, "ocm_remote_sz of a local kind: %zu", sz);
  CHECK(ocm_localbuf(a, &buf, &len) == 0 && buf != NULL && len == LOC, "ocm_localbuf");
  unsigned char *expect = must_malloc(LOC), *got = must_malloc(LOC);
  fill(expect, LOC, 3);
  if (kind == OCM_LOCAL_GPU) {
    CHECK(ocm_copy_in(a, expect) == 0, "ocm_copy_in");
  } else {
    memcpy(buf, expect, LOC);
  }
  CHECK(ocm_copy_out(got, a) == 0 && memcmp(got, expect, LOC) == 0, "ocm_copy_out");
  struct ocm_params p = {0, 0, 0, 0, 1, 0};
  CHECK(ocm_copy_onesided(a, &p) == -1, "one-sided on a local kind");
  CHECK(ocm_free(a) == 0, "ocm_free");
  free(expect);
  free(got);
  printf("ok %s: localbuf, copy in and out\n", kind_name(kind));
}

/* ocm_copy between allocations: remote to remote (both hops), local to
 * remote with op_flag 0 (the arguments swapped), local to local. */
static void copies(void) {
  ocm_alloc_t a = make(OCM_REMOTE_RDMA, LOC, REM);
  ocm_alloc_t b = make(OCM_REMOTE_RMA, LOC, REM);
  ocm_alloc_t h = make(OCM_LOCAL_HOST, LOC, 0);
  unsigned char *ra = must_malloc(REM), *rb = must_malloc(REM), *got = must_malloc(REM);
  fill(ra, REM, 11);
  fill(rb, REM, 12);
  CHECK(ocm_copy_in(a, ra) == 0 && ocm_copy_in(b, rb) == 0, "ocm_copy_in");

  size_t n = (1u << 20) + 5;
  struct ocm_params p = {100, 200, 1000, 3000, n, 1};
  CHECK(ocm_copy(b, a, &p) == 0, "ocm_copy remote to remote");
  memcpy(rb + 3000, ra + 1000, n);
  CHECK(ocm_copy_out(got, b) == 0 && memcmp(got, rb, REM) == 0, "the destination's remote buffer");
  void *abuf, *bbuf;
  size_t len;
  CHECK(ocm_localbuf(a, &abuf, &len) == 0 && ocm_localbuf(b, &bbuf, &len) == 0, "ocm_localbuf");
  CHECK(memcmp((unsigned char *)abuf + 100, ra + 1000, n) == 0, "the source's local buffer");
  CHECK(memcmp((unsigned char *)bbuf + 200, ra + 1000, n) == 0, "the destination's local buffer");

  /* op_flag 0: from `dst` (h, at dest_offset) to `src` (b, at src_offset,
   * then its remote buffer at src_offset_2). */
  void *hbuf;
  CHECK(ocm_localbuf(h, &hbuf, &len) == 0, "ocm_localbuf");
  fill(hbuf, LOC, 13);
  struct ocm_params q = {7, 9, 5000, 0, 65536, 0};
  CHECK(ocm_copy(h, b, &q) == 0, "ocm_copy with op_flag 0");
  memcpy(rb + 5000, (unsigned char *)hbuf + 9, 65536);
  CHECK(ocm_copy_out(got, b) == 0 && memcmp(got, rb, REM) == 0, "the remote buffer after op_flag 0");

  ocm_alloc_t h2 = make(OCM_LOCAL_RDMA, LOC, 0);
  struct ocm_params r = {0, 1, 0, 0, LOC - 1, 1};
  CHECK(ocm_copy(h2, h, &r) == 0, "ocm_copy local to local");
  CHECK(ocm_copy_out(got, h2) == 0 && memcmp(got + 1, hbuf, LOC - 1) == 0, "local to local");
  struct ocm_params over = {0, 0, 0, REM - 1, 2, 1};
  CHECK(ocm_copy(b, h, &over) == -4, "past the destination's remote buffer");

  CHECK(ocm_free(a) == 0 && ocm_free(b) == 0 && ocm_free(h) == 0 && ocm_free(h2) == 0, "ocm_free");
  free(ra);
  free(rb);
  free(got);
  printf("ok ocm_copy: remote to remote, local to remote (op_flag 0), local to local\n");
}

/* ocm_copy with GPU memory at both ends: this node's GPU memory to an
 * allocation of GPU memory an agent holds (through the latter's local
 * buffer) and back, each byte checked. Skipped without a GPU. */
static void gpu_copies(void) {
  ocm_alloc_t g = make(OCM_LOCAL_GPU, LOC, 0);
  if (g == NULL) return;
  ocm_alloc_t r = make(OCM_REMOTE_GPU, LOC, REM);
  if (r == NULL) {
    CHECK(ocm_free(g) == 0, "ocm_free");
    return;
  }
  unsigned char *expect = must_malloc(LOC), *got = must_malloc(REM);
  fill(expect, LOC, 21);
  CHECK(ocm_copy_in(g, expect) == 0, "ocm_copy_in to GPU memory");
  size_t n = (1u << 20) + 5;
  /* g's device bytes [0, n) -> r's local buffer [0, n) -> r's remote GPU bytes at 4096. */
  struct ocm_params out = {0, 0, 0, 4096, n, 1};
  CHECK(ocm_copy(r, g, &out) == 0, "ocm_copy local GPU to remote GPU");
  CHECK(ocm_copy_out(got, r) == 0 && memcmp(got + 4096, expect, n) == 0, "the remote GPU bytes");
  void *rbuf;
  size_t len;
  CHECK(ocm_localbuf(r, &rbuf, &len) == 0 && memcmp(rbuf, expect, n) == 0, "the local buffer on the way");
  /* And back, shifted: r's remote bytes at 4096 -> r's local buffer -> g's device bytes at 7. */
  memset(rbuf, 0, len);
  struct ocm_params back = {0, 7, 4096, 0, n, 1};
  CHECK(ocm_copy(g, r, &back) == 0, "ocm_copy remote GPU to local GPU");
  CHECK(ocm_copy_out(got, g) == 0 && memcmp(got + 7, expect, n) == 0, "the local GPU bytes");
  CHECK(ocm_free(g) == 0 && ocm_free(r) == 0, "ocm_free");
  free(expect);
  free(got);
  printf("ok ocm_copy with GPU memory: local GPU to remote GPU and back\n");
}

static void bad_input(void) {
  CHECK(ocm_alloc(NULL) == NULL && oncillamem_last_error() == -1, "ocm_alloc(NULL)");
  struct ocm_alloc_params odd = {4096, 4096, 0};
  odd.kind = 9;
  CHECK(ocm_alloc(&odd) == NULL && oncillamem_last_error() == -1, "kind 9");
  struct ocm_alloc_params empty = {4096, 0, OCM_REMOTE_RDMA};
  CHECK(ocm_alloc(&empty) == NULL && oncillamem_last_error() == -1, "a remote kind of 0 bytes");
  struct ocm_alloc_params none = {0, 0, OCM_LOCAL_HOST};
  CHECK(ocm_alloc(&none) == NULL && oncillamem_last_error() == -1, "a local kind of 0 bytes");
  struct ocm_alloc_params huge = {0, (uint64_t)1 << 50, OCM_REMOTE_RMA};
  CHECK(ocm_alloc(&huge) == NULL && oncillamem_last_error() == -5, "more than the cluster holds");

  ocm_alloc_t bogus = (ocm_alloc_t)(uintptr_t)0x1234;
  CHECK(ocm_free(bogus) == -2, "ocm_free of a forged handle");
  CHECK(ocm_free(NULL) == -2, "ocm_free(NULL)");
  CHECK(ocm_alloc_kind(bogus) == OCM_KIND_INVALID, "ocm_alloc_kind of a forged handle");
  CHECK(!ocm_is_remote(bogus) && oncillamem_last_error() == -2, "ocm_is_remote of a forged handle");

  ocm_alloc_t a = make(OCM_REMOTE_RMA, 0, 8192);
  void *buf = (void *)1;
  size_t len = 1;
  CHECK(ocm_localbuf(a, &buf, &len) == 0 && buf == NULL && len == 0, "a 0-byte local buffer");
  CHECK(ocm_localbuf(a, NULL, &len) == -1, "ocm_localbuf(NULL)");
  CHECK(ocm_remote_sz(a, NULL) == -1, "ocm_remote_sz(NULL)");
  CHECK(ocm_copy_out(NULL, a) == -1, "ocm_copy_out(NULL)");
  CHECK(ocm_copy_in(a, NULL) == -1, "ocm_copy_in(NULL)");
  CHECK(ocm_copy(a, a, NULL) == -1, "ocm_copy without options");
  struct ocm_params p = {0, 0, 0, 0, 1, 0};
  CHECK(ocm_copy_onesided(a, &p) == -4, "one-sided into a 0-byte local buffer");
  CHECK(ocm_free(a) == 0, "ocm_free");
  CHECK(ocm_free(a) == -2, "a second ocm_free");
  CHECK(strcmp(oncillamem_strerror(-2), "bad allocation handle (NULL, unknown or freed)") == 0,
        "oncillamem_strerror");
  printf("ok bad input\n");
}

int main(void) {
  CHECK(ocm_init() == 0, "ocm_init");
  CHECK(ocm_init() == 0, "a second ocm_init");
  enum ocm_kind remote[] = {OCM_REMOTE_RMA, OCM_REMOTE_RDMA, OCM_REMOTE_GPU};
  enum ocm_kind local[] = {OCM_LOCAL_HOST, OCM_LOCAL_RMA, OCM_LOCAL_RDMA, OCM_LOCAL_GPU};
  for (size_t i = 0; i < sizeof remote / sizeof remote[0]; i++) remote_kind(remote[i]);
  for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) local_kind(local[i]);
  copies();
  gpu_copies();
  bad_input();
  /* Left for ocm_tini to free. */
  ocm_alloc_t left = make(OCM_REMOTE_RDMA, 4096, 1u << 20);
  CHECK(left != NULL, "an allocation for ocm_tini");
  CHECK(ocm_tini() == 0, "ocm_tini");
  struct ocm_alloc_params ap = {4096, 4096, OCM_REMOTE_RMA};
  CHECK(ocm_alloc(&ap) == NULL && oncillamem_last_error() == -3, "ocm_alloc after ocm_tini");
  CHECK(ocm_tini() == -3, "a second ocm_tini");
  printf("ok tini\n");
  return 0;
}
