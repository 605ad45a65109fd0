/* The C ABI against a real local cluster (run by tests/tests/c_abi.rs with
 * ONCILLA_SOCKET and ONCILLA_TOKEN_FILE set):
 *
 *   abi basic         every kind: copies with offsets, localbuf, queries,
 *                     and the status codes of bad input
 *   abi create NAME   a persistent allocation NAME on node-1, filled
 *   abi attach NAME   attaches NAME from this second process, checks the
 *                     bytes, frees it
 *
 * Prints one line per check group and exits non-zero on the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oncilla.h"

#define LEN (3u << 20)

static int failures;

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                 \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error %d: %s)\n", ocm_last_error(),          \
              ocm_last_error_message());                                   \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static void fill(unsigned char *b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 31u + seed) % 251u);
}

static const char *kind_name(ocm_kind_t k) {
  switch (k) {
    case OCM_LOCAL_HOST: return "local-host";
    case OCM_REMOTE_HOST: return "remote-host";
    case OCM_LOCAL_GPU: return "local-gpu";
    case OCM_REMOTE_GPU: return "remote-gpu";
    default: return "invalid";
  }
}

/* An allocation of `kind` on node-1 where the kind allows naming a node;
 * NULL (and a skip line) where the machine has no GPU. */
static ocm_alloc_t make(ocm_kind_t kind) {
  ocm_params_t p = ocm_params_default(LEN, kind);
  const char *node = "node-1";
  if (kind == OCM_REMOTE_HOST || kind == OCM_REMOTE_GPU) {
    p.nodes = &node;
    p.n_nodes = 1;
  }
  ocm_alloc_t a = ocm_alloc_ex(&p);
  if (a == NULL && ocm_last_error() == OCM_E_NO_GPU) {
    printf("skipped %s: %s\n", kind_name(kind), ocm_last_error_message());
    return NULL;
  }
  CHECK(a != NULL, "ocm_alloc_ex(%s)", kind_name(kind));
  return a;
}

static int basic(void) {
  /* Before ocm_init. */
  {
    /* The library this runs with is the one the header describes. */
    char want[32];
    snprintf(want, sizeof want, "%u.%u.%u", OCM_VERSION_MAJOR, OCM_VERSION_MINOR,
             OCM_VERSION_PATCH);
    CHECK(ocm_version() != NULL && strcmp(ocm_version(), want) == 0, "ocm_version() is %s",
          want);
    printf("ok version: %s\n", ocm_version());
  }
  CHECK(ocm_alloc(4096, OCM_LOCAL_HOST) == NULL, "alloc before init");
  CHECK(ocm_last_error() == OCM_E_NOT_INITIALIZED, "not-initialized code");
  CHECK(ocm_init() == OCM_OK, "ocm_init");
  CHECK(ocm_init() == OCM_OK, "a second ocm_init is harmless");

  unsigned char *data = malloc(LEN), *back = malloc(LEN);
  CHECK(data && back, "malloc");
  fill(data, LEN, 7);

  ocm_kind_t kinds[] = {OCM_LOCAL_HOST, OCM_REMOTE_HOST, OCM_LOCAL_GPU, OCM_REMOTE_GPU};
  ocm_alloc_t allocs[4];
  int n = 0;
  for (int i = 0; i < 4; i++) {
    ocm_alloc_t a = make(kinds[i]);
    if (a == NULL) continue;
    CHECK(ocm_kind(a) == kinds[i], "ocm_kind");
    CHECK(ocm_remote_sz(a) == LEN, "ocm_remote_sz");
    int remote = kinds[i] == OCM_REMOTE_HOST || kinds[i] == OCM_REMOTE_GPU;
    CHECK(ocm_is_remote(a) == remote, "ocm_is_remote(%s)", kind_name(kinds[i]));
    /* copy in at an offset, read back at that offset */
    CHECK(ocm_copy_in(a, 4096, data, LEN - 4096) == OCM_OK, "copy_in");
    memset(back, 0, LEN);
    CHECK(ocm_copy_out(a, 4096, back, LEN - 4096) == OCM_OK, "copy_out");
    CHECK(memcmp(back, data, LEN - 4096) == 0, "%s round trip", kind_name(kinds[i]));
    void *local = ocm_localbuf(a);
    if (kinds[i] == OCM_LOCAL_HOST) {
      CHECK(local != NULL, "localbuf of local host memory");
      CHECK(memcmp((unsigned char *)local + 4096, data, 64) == 0, "localbuf sees the bytes");
    } else {
      CHECK(local == NULL && ocm_last_error() == OCM_E_INVALID, "no localbuf for %s",
            kind_name(kinds[i]));
    }
    printf("ok %s: copy_in/copy_out at offset 4096, queries\n", kind_name(kinds[i]));
    allocs[n++] = a;
  }
  /* ocm_copy between every pair, with offsets on both sides */
  for (int s = 0; s < n; s++) {
    for (int d = 0; d < n; d++) {
      if (s == d) continue;
      CHECK(ocm_copy_in(allocs[s], 100, data, 1 << 20) == OCM_OK, "seed source");
      CHECK(ocm_copy(allocs[d], 5000, allocs[s], 100, 1 << 20) == OCM_OK, "ocm_copy %s -> %s",
            kind_name(ocm_kind(allocs[s])), kind_name(ocm_kind(allocs[d])));
      memset(back, 0, 1 << 20);
      CHECK(ocm_copy_out(allocs[d], 5000, back, 1 << 20) == OCM_OK, "read copy");
      CHECK(memcmp(back, data, 1 << 20) == 0, "ocm_copy %s -> %s bytes",
            kind_name(ocm_kind(allocs[s])), kind_name(ocm_kind(allocs[d])));
    }
  }
  printf("ok ocm_copy between %d kinds, both ways, at offsets\n", n);

  /* bad input */
  ocm_alloc_t a = allocs[0];
  CHECK(ocm_copy_out(a, LEN - 10, back, 20) == OCM_E_OUT_OF_BOUNDS, "out of bounds read");
  CHECK(strstr(ocm_last_error_message(), "out of bounds") != NULL, "message says so");
  CHECK(ocm_copy_in(a, LEN, data, 1) == OCM_E_OUT_OF_BOUNDS, "out of bounds write");
  CHECK(ocm_copy_in(a, 0, NULL, 10) == OCM_E_INVALID, "NULL source");
  CHECK(ocm_copy_out(a, 0, NULL, 10) == OCM_E_INVALID, "NULL destination");
  CHECK(ocm_copy_in(NULL, 0, data, 10) == OCM_E_BAD_HANDLE, "NULL handle");
  CHECK(ocm_copy((ocm_alloc_t)0x1234, 0, a, 0, 10) == OCM_E_BAD_HANDLE, "forged handle");
  CHECK(ocm_kind(NULL) == OCM_KIND_INVALID, "kind of NULL");
  CHECK(ocm_is_remote(NULL) == -1 && ocm_last_error() == OCM_E_BAD_HANDLE, "is_remote(NULL)");
  CHECK(ocm_remote_sz(NULL) == 0, "remote_sz(NULL)");
  CHECK(ocm_alloc(4096, (ocm_kind_t)0) == NULL && ocm_last_error() == OCM_E_INVALID, "bad kind");
  CHECK(ocm_alloc_ex(NULL) == NULL && ocm_last_error() == OCM_E_INVALID, "NULL params");
  /* Values outside the enums (once SIGILL in the caller) and flags other than 0/1. */
  CHECK(ocm_alloc(4096, 5) == NULL && ocm_last_error() == OCM_E_INVALID, "kind 5");
  CHECK(ocm_alloc(4096, -1) == NULL && ocm_last_error() == OCM_E_INVALID, "kind -1");
  {
    ocm_params_t bad = ocm_params_default(4096, OCM_REMOTE_HOST);
    bad.policy = 99;
    CHECK(ocm_alloc_ex(&bad) == NULL && ocm_last_error() == OCM_E_INVALID, "policy 99");
    bad = ocm_params_default(4096, OCM_REMOTE_HOST);
    bad.fabric = 77;
    CHECK(ocm_alloc_ex(&bad) == NULL && ocm_last_error() == OCM_E_INVALID, "fabric 77");
    bad = ocm_params_default(4096, OCM_REMOTE_HOST);
    bad.persistent = 2;
    CHECK(ocm_alloc_ex(&bad) == NULL && ocm_last_error() == OCM_E_INVALID, "persistent 2");
    CHECK(strstr(ocm_last_error_message(), "persistent is 2") != NULL, "message names it");
    /* The struct's size, as the program knows it, travels with it. */
    CHECK(bad.struct_size == sizeof(ocm_params_t), "struct_size set by ocm_params_default");
    bad.struct_size = 0; /* as a struct filled by hand would have it */
    CHECK(ocm_alloc_ex(&bad) == NULL && ocm_last_error() == OCM_E_INVALID, "struct_size 0");
    CHECK(strstr(ocm_last_error_message(), "ocm_params_default") != NULL, "message says how");
    CHECK(ocm_params_init(&bad, 8, 4096, OCM_REMOTE_HOST) == OCM_E_INVALID, "init for 8 bytes");
    CHECK(ocm_params_init(NULL, sizeof bad, 4096, OCM_REMOTE_HOST) == OCM_E_INVALID, "init NULL");
  }
  CHECK(ocm_attach("no-such-name-here") == NULL && ocm_last_error() == OCM_E_NOT_FOUND,
        "attach unknown name");
  CHECK(ocm_alloc(1ull << 50, OCM_REMOTE_HOST) == NULL && ocm_last_error() == OCM_E_NO_MEMORY,
        "too large");
  for (int c = 0; c <= 17; c++) CHECK(strlen(ocm_strerror(c)) > 0, "strerror(%d)", c);
  CHECK(strcmp(ocm_strerror(99), "unknown status code") == 0, "strerror of unknown");
  printf("ok bad input: NULL/forged handles, NULL buffers, bounds, kinds, policies, fabrics, flags, names, size\n");

  {
    /* A batch: 64 handles, each its own allocation, all or none. */
    enum { BATCH = 64 };
    ocm_alloc_t many[BATCH] = {0};
    ocm_params_t p = ocm_params_default(4096, OCM_REMOTE_HOST);
    CHECK(ocm_alloc_many(&p, BATCH, many) == OCM_OK, "ocm_alloc_many: %s", ocm_last_error_message());
    for (int i = 0; i < BATCH; i++) {
      CHECK(many[i] != NULL && ocm_remote_sz(many[i]) == 4096, "batch handle %d", i);
      for (int j = 0; j < i; j++) CHECK(many[i] != many[j], "batch handles %d and %d differ", j, i);
      fill(data, 4096, (unsigned)i);
      CHECK(ocm_copy_in(many[i], 0, data, 4096) == OCM_OK, "batch write %d", i);
    }
    for (int i = 0; i < BATCH; i++) {
      fill(data, 4096, (unsigned)i);
      CHECK(ocm_copy_out(many[i], 0, back, 4096) == OCM_OK, "batch read %d", i);
      CHECK(memcmp(back, data, 4096) == 0, "batch allocation %d kept its bytes", i);
    }
    ocm_alloc_t untouched[2] = {(ocm_alloc_t)0x11, (ocm_alloc_t)0x22};
    CHECK(ocm_alloc_many(&p, 0, untouched) == OCM_E_INVALID, "count 0");
    CHECK(ocm_alloc_many(&p, 257, untouched) == OCM_E_INVALID, "count 257");
    CHECK(ocm_alloc_many(&p, 2, NULL) == OCM_E_INVALID, "NULL out");
    CHECK(ocm_alloc_many(NULL, 2, untouched) == OCM_E_INVALID, "NULL params");
    ocm_params_t named = p;
    named.name = "batch";
    CHECK(ocm_alloc_many(&named, 2, untouched) == OCM_E_INVALID, "a named batch");
    ocm_params_t huge = ocm_params_default(1ull << 40, OCM_REMOTE_HOST);
    CHECK(ocm_alloc_many(&huge, 2, untouched) == OCM_E_NO_MEMORY, "a batch past the cluster");
    CHECK(untouched[0] == (ocm_alloc_t)0x11 && untouched[1] == (ocm_alloc_t)0x22,
          "a refused batch leaves out as it was");
    /* Freed together: bad batches touch no handle, then one call frees all. */
    CHECK(ocm_free_many(many, 0) == OCM_E_INVALID, "free_many of none");
    CHECK(ocm_free_many(many, 257) == OCM_E_INVALID, "free_many of 257");
    CHECK(ocm_free_many(NULL, 2) == OCM_E_INVALID, "free_many of NULL");
    ocm_alloc_t twice[2] = {many[0], many[0]};
    CHECK(ocm_free_many(twice, 2) == OCM_E_INVALID, "free_many of one handle twice");
    ocm_alloc_t forged[2] = {many[0], (ocm_alloc_t)0x22};
    CHECK(ocm_free_many(forged, 2) == OCM_E_BAD_HANDLE, "free_many with a forged handle");
    CHECK(ocm_copy_out(many[0], 0, back, 4096) == OCM_OK, "a refused free_many left the handle live");
    CHECK(ocm_free_many(many, BATCH) == OCM_OK, "free_many: %s", ocm_last_error_message());
    CHECK(ocm_copy_out(many[1], 0, back, 1) == OCM_E_BAD_HANDLE, "a handle freed by free_many");
    printf("ok batch: 64 distinct allocations in one call and freed in one, refusals leave nothing\n");
  }

  for (int i = 0; i < n; i++) CHECK(ocm_free(allocs[i]) == OCM_OK, "free");
  CHECK(ocm_copy_in(allocs[0], 0, data, 1) == OCM_E_BAD_HANDLE, "freed handle");
  CHECK(ocm_free(allocs[0]) == OCM_E_BAD_HANDLE, "double free");
  printf("ok free: freed handles are refused\n");

  CHECK(ocm_tini() == OCM_OK, "ocm_tini");
  CHECK(ocm_alloc(4096, OCM_LOCAL_HOST) == NULL && ocm_last_error() == OCM_E_NOT_INITIALIZED,
        "alloc after tini");
  free(data);
  free(back);
  return failures;
}

static int create(const char *name) {
  CHECK(ocm_init() == OCM_OK, "ocm_init");
  ocm_params_t p = ocm_params_default(LEN, OCM_REMOTE_HOST);
  const char *node = "node-1";
  p.nodes = &node;
  p.n_nodes = 1;
  p.name = name;
  p.persistent = true;
  ocm_alloc_t a = ocm_alloc_ex(&p);
  CHECK(a != NULL, "named persistent allocation");
  unsigned char *data = malloc(LEN);
  CHECK(data != NULL, "malloc");
  fill(data, LEN, 42);
  CHECK(ocm_copy_in(a, 0, data, LEN) == OCM_OK, "fill");
  /* A second one with the same name is refused. */
  CHECK(ocm_alloc_ex(&p) == NULL && ocm_last_error() == OCM_E_EXISTS, "name taken");
  printf("ok created %s\n", name);
  free(data);
  return ocm_tini() == OCM_OK ? 0 : 1; /* persistent: it stays */
}

static int attach(const char *name) {
  CHECK(ocm_init() == OCM_OK, "ocm_init");
  ocm_alloc_t a = ocm_attach(name);
  CHECK(a != NULL, "attach %s", name);
  CHECK(ocm_remote_sz(a) == LEN, "size");
  unsigned char *data = malloc(LEN), *back = malloc(LEN);
  CHECK(data && back, "malloc");
  fill(data, LEN, 42);
  CHECK(ocm_copy_out(a, 0, back, LEN) == OCM_OK, "read");
  CHECK(memcmp(back, data, LEN) == 0, "the other process's bytes");
  /* Two handles of one allocation in one batch: refused, both live. */
  ocm_alloc_t again = ocm_attach(name);
  CHECK(again != NULL && again != a, "a second handle of %s", name);
  ocm_alloc_t both[2] = {a, again};
  CHECK(ocm_free_many(both, 2) == OCM_E_INVALID, "free_many of one allocation twice");
  CHECK(ocm_copy_out(again, 0, back, 1) == OCM_OK && ocm_copy_out(a, 0, back, 1) == OCM_OK,
        "a refused free_many left both handles live");
  CHECK(ocm_free(a) == OCM_OK, "free from the second process");
  CHECK(ocm_free(again) == OCM_E_NOT_FOUND, "the second handle: freed through the first");
  printf("ok attached %s from a second process and freed it\n", name);
  free(data);
  free(back);
  return ocm_tini() == OCM_OK ? 0 : 1;
}

/* Remote memory through a pointer: ocm_map, reads and writes through it,
 * ocm_flush (then a copy sees the writes), ocm_invalidate (then the
 * pointer sees a copy's writes), and the refusals of a second map, a bad
 * flag, an unmapped handle and a double unmap. */
static int mapped(void) {
  CHECK(ocm_init() == OCM_OK, "ocm_init");
  ocm_alloc_t a = make(OCM_REMOTE_HOST);
  unsigned char *data = malloc(LEN), *back = malloc(LEN);
  CHECK(a && data && back, "alloc and malloc");
  fill(data, LEN, 5);
  CHECK(ocm_copy_in(a, 0, data, LEN) == OCM_OK, "fill");
  void *p = NULL;
  CHECK(ocm_map(a, 1, &p) == OCM_E_INVALID, "flags must be 0");
  CHECK(ocm_map(a, 0, NULL) == OCM_E_INVALID, "NULL ptr");
  CHECK(ocm_flush(a, 0, 1) == OCM_E_INVALID, "flush before map");
  CHECK(ocm_map(a, 0, &p) == OCM_OK && p != NULL, "ocm_map: %s", ocm_last_error_message());
  void *again = NULL;
  CHECK(ocm_map(a, 0, &again) == OCM_E_EXISTS, "a second map is refused");
  unsigned char *m = p;
  CHECK(memcmp(m, data, LEN) == 0, "the pointer reads the allocation");
  fill(data, LEN, 6);
  memcpy(m + 4096, data, LEN - 8192);
  CHECK(ocm_flush(a, 0, LEN) == OCM_OK, "ocm_flush");
  CHECK(ocm_copy_out(a, 4096, back, LEN - 8192) == OCM_OK, "read after flush");
  CHECK(memcmp(back, data, LEN - 8192) == 0, "a copy sees what was flushed");
  fill(data, 1 << 20, 7);
  CHECK(ocm_copy_in(a, 0, data, 1 << 20) == OCM_OK, "write by copy");
  CHECK(ocm_invalidate(a, 0, 1 << 20) == OCM_OK, "ocm_invalidate");
  CHECK(memcmp(m, data, 1 << 20) == 0, "the pointer sees the copy after invalidate");
  CHECK(ocm_flush(a, LEN, 1) == OCM_E_OUT_OF_BOUNDS, "flush past the end");
  CHECK(ocm_unmap(a) == OCM_OK, "ocm_unmap");
  CHECK(ocm_unmap(a) == OCM_E_INVALID, "a double unmap is refused");
  CHECK(ocm_invalidate(a, 0, 1) == OCM_E_INVALID, "invalidate after unmap");
  CHECK(ocm_map(a, 0, &p) == OCM_OK, "map again");
  CHECK(ocm_free(a) == OCM_OK, "free while mapped unmaps first");
  printf("ok map: pointer reads, flush, invalidate, refusals\n");
  free(data);
  free(back);
  return ocm_tini() == OCM_OK ? failures : 1;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "map") == 0) return mapped();
  if (argc == 2 && strcmp(argv[1], "basic") == 0) return basic();
  if (argc == 3 && strcmp(argv[1], "create") == 0) return create(argv[2]);
  if (argc == 3 && strcmp(argv[1], "attach") == 0) return attach(argv[2]);
  fprintf(stderr, "usage: abi basic | abi map | abi create NAME | abi attach NAME\n");
  return 2;
}
