/* The relational microbenchmarks of the Oncilla paper (its Figure 6) on the
 * CPU: SELECT, JOIN and SELECT-PROJECT-JOIN over tables that are streamed
 * into this process in chunks, either from remote memory (the tables live
 * in Oncilla allocations on other nodes) or from a file (read from the page
 * cache, and cold after the cache is dropped), as in the paper's Figures
 * 10-11.
 *
 *   S(key, val)  the streamed fact table, 8-byte tuples, key uniform in
 *                [0, 2|R|), val uniform in [0, 1000)
 *   R(key, val)  the dimension table, keys 0..|R|-1 shuffled, so about half
 *                of S finds a partner
 *
 *   select  rows of S with val < 100 (10%), copied to an output buffer
 *   join    S join R on key (hash table built from R as it streams in)
 *   spj     select val < 100 from S, project key, join R
 *
 * Either source feeds the operator through the same pipeline: a reader
 * thread moves chunk i + 1 into one of three buffers while the operator
 * runs on chunk i. Every run's answer (rows out and a checksum) is
 * compared with the same operator over the tables in this process's
 * memory. Each row of the table is the median of the repetitions: the
 * reader's time moving chunks (TRANSFER), the operator's time waiting for
 * one (STALL) and running on them (COMPUTE), and the run's wall time
 * (TOTAL, about STALL + COMPUTE).
 *
 * Run against a local cluster:  examples/c/run.sh relational [--tuples 4M]
 * On a cluster: relational --nodes NAME[,NAME...] with liboncilla's
 * environment set. */
#define _GNU_SOURCE /* posix_fadvise, fdatasync, getopt_long */
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <unistd.h>

#include "common.h"

#define MAX_NODES 16
#define MAX_REPS 20
#define MAX_SIZES 8
#define SLOTS 3
#define SELECT_BELOW 100u
#define VAL_RANGE 1000u

typedef struct {
  uint32_t key;
  uint32_t val;
} tuple_t;

typedef struct {
  uint64_t rows;
  uint64_t sum;
} answer_t;

enum op { SELECT, JOIN, SPJ, OPS };
static const char *op_names[OPS] = {"select", "join", "spj"};
enum source { REMOTE, FILE_CACHED, FILE_COLD, SOURCES };
static const char *source_names[SOURCES] = {"remote memory", "file (cached)", "file (cold)"};

/* Where the tables are: one remote allocation and one (unlinked) file
 * each, both holding the same bytes. */
typedef struct {
  ocm_alloc_t remote_r, remote_s;
  int file_r, file_s;
} store_t;

/* R's hash table: open addressing, linear probing; key + 1 in `slot_key`
 * (0 is empty). */
typedef struct {
  uint32_t *slot_key;
  uint32_t *slot_val;
  uint64_t mask;
} table_t;

static table_t table_new(uint64_t r_rows) {
  uint64_t cap = 1;
  while (cap < 2 * r_rows) cap <<= 1;
  table_t t = {.slot_key = calloc(cap, sizeof(uint32_t)),
               .slot_val = malloc(cap * sizeof(uint32_t)),
               .mask = cap - 1};
  CHECK(t.slot_key && t.slot_val, "out of memory for a %" PRIu64 "-slot hash table", cap);
  return t;
}

static void table_free(table_t *t) {
  free(t->slot_key);
  free(t->slot_val);
}

static inline uint64_t slot_of(uint32_t key, uint64_t mask) {
  return ((uint64_t)key * 0x9E3779B97F4A7C15ull >> 20) & mask;
}

static void table_insert(table_t *t, const tuple_t *rows, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t s = slot_of(rows[i].key, t->mask);
    while (t->slot_key[s] != 0) s = (s + 1) & t->mask;
    t->slot_key[s] = rows[i].key + 1;
    t->slot_val[s] = rows[i].val;
  }
}

/* R's val for `key`, or -1 when R has no such key. */
static inline int64_t table_find(const table_t *t, uint32_t key) {
  for (uint64_t s = slot_of(key, t->mask);; s = (s + 1) & t->mask) {
    uint32_t k = t->slot_key[s];
    if (k == 0) return -1;
    if (k == key + 1) return t->slot_val[s];
  }
}

/* One operator over one chunk of S; `out` holds a chunk's worth of rows. */
static void run_op(enum op op, const table_t *r, const tuple_t *s, size_t n, tuple_t *out,
                   answer_t *a) {
  switch (op) {
    case SELECT: {
      size_t k = 0;
      for (size_t i = 0; i < n; i++)
        if (s[i].val < SELECT_BELOW) out[k++] = s[i];
      for (size_t i = 0; i < k; i++) a->sum += out[i].key;
      a->rows += k;
      break;
    }
    case JOIN:
      for (size_t i = 0; i < n; i++) {
        int64_t v = table_find(r, s[i].key);
        if (v >= 0) {
          a->rows++;
          a->sum += (uint64_t)v + s[i].val;
        }
      }
      break;
    case SPJ: {
      /* select, then project the key column, then join */
      uint32_t *keys = (uint32_t *)out;
      size_t k = 0;
      for (size_t i = 0; i < n; i++)
        if (s[i].val < SELECT_BELOW) keys[k++] = s[i].key;
      for (size_t i = 0; i < k; i++) {
        int64_t v = table_find(r, keys[i]);
        if (v >= 0) {
          a->rows++;
          a->sum += (uint64_t)v;
        }
      }
      break;
    }
    default: break;
  }
}

static void read_file(int fd, void *buf, size_t len, uint64_t off) {
  for (size_t done = 0; done < len;) {
    ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
    CHECK(n > 0, "reading the table file: %s", n == 0 ? "unexpected end" : strerror(errno));
    done += (size_t)n;
  }
}

static void write_file(int fd, const void *buf, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = write(fd, (const char *)buf + done, len - done);
    CHECK(n > 0, "writing the table file: %s", strerror(errno));
    done += (size_t)n;
  }
}

/* A file in `dir` holding `len` bytes of `data`, already unlinked so it
 * goes away with this process however it ends. */
static int table_file(const char *dir, const void *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/oncilla-relational-XXXXXX", dir);
  int fd = mkstemp(path);
  CHECK(fd >= 0, "creating a table file in %s: %s (choose another with --dir)", dir,
        strerror(errno));
  CHECK(unlink(path) == 0, "unlinking %s: %s", path, strerror(errno));
  write_file(fd, data, len);
  CHECK(fdatasync(fd) == 0, "syncing the table file: %s", strerror(errno));
  return fd;
}

/* Drops the files' pages from the page cache so the next read goes to the
 * device. */
static void drop_cache(const store_t *st) {
  int fds[] = {st->file_r, st->file_s};
  for (size_t i = 0; i < 2; i++) {
    int rc = posix_fadvise(fds[i], 0, 0, POSIX_FADV_DONTNEED);
    CHECK(rc == 0, "dropping the table file from the page cache: %s", strerror(rc));
  }
}

typedef struct {
  double transfer, stall, compute, total;
} timing_t;

/* Moves `len` bytes at `off` of table S (`is_s`) or R from `src` into `buf`. */
static void fetch(const store_t *st, enum source src, int is_s, uint64_t off, tuple_t *buf,
                  size_t len) {
  if (src == REMOTE)
    OCM(ocm_copy_out(is_s ? st->remote_s : st->remote_r, off, buf, len));
  else
    read_file(is_s ? st->file_s : st->file_r, buf, len, off);
}

/* The input pipeline of one run: a reader thread fills SLOTS chunk buffers
 * in turn (R's chunks first when the operator needs R, then S's) while the
 * operator consumes them, so moving chunk i + 1 overlaps computing on
 * chunk i, for either source. */
typedef struct {
  const store_t *st;
  enum source src;
  uint64_t r_chunks, chunks, r_rows, s_rows;
  size_t chunk_rows;
  tuple_t *slot[SLOTS];
  size_t rows[SLOTS];
  int full[SLOTS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double transfer; /* the reader's time in fetch */
} pipe_t;

/* Chunk k of the sequence: which table, where, how many rows. */
static void chunk_at(const pipe_t *p, uint64_t k, int *is_s, uint64_t *first, size_t *n) {
  uint64_t rows = p->r_rows, i = k;
  *is_s = k >= p->r_chunks;
  if (*is_s) {
    rows = p->s_rows;
    i = k - p->r_chunks;
  }
  *first = i * p->chunk_rows;
  *n = (size_t)(rows - *first < p->chunk_rows ? rows - *first : p->chunk_rows);
}

static void *reader(void *arg) {
  pipe_t *p = arg;
  for (uint64_t k = 0; k < p->chunks; k++) {
    int slot = (int)(k % SLOTS), is_s;
    uint64_t first;
    size_t n;
    chunk_at(p, k, &is_s, &first, &n);
    pthread_mutex_lock(&p->mu);
    while (p->full[slot]) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    double t0 = now_ms();
    fetch(p->st, p->src, is_s, first * sizeof(tuple_t), p->slot[slot], n * sizeof(tuple_t));
    double t1 = now_ms();
    pthread_mutex_lock(&p->mu);
    p->transfer += t1 - t0;
    p->rows[slot] = n;
    p->full[slot] = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  return NULL;
}

static uint64_t chunks_of(uint64_t rows, size_t chunk_rows) {
  return (rows + chunk_rows - 1) / chunk_rows;
}

/* One run of `op` over R (r_rows) and the first s_rows of S from `src`,
 * through the pipeline; `slots` are SLOTS chunk buffers. */
static answer_t run(const store_t *st, enum source src, enum op op, uint64_t r_rows,
                    uint64_t s_rows, size_t chunk_rows, tuple_t *slots[SLOTS], tuple_t *out,
                    timing_t *t) {
  answer_t a = {0, 0};
  *t = (timing_t){0, 0, 0, 0};
  if (src == FILE_COLD) drop_cache(st);
  double start = now_ms();
  pipe_t p = {.st = st,
              .src = src,
              .r_chunks = op == SELECT ? 0 : chunks_of(r_rows, chunk_rows),
              .r_rows = r_rows,
              .s_rows = s_rows,
              .chunk_rows = chunk_rows};
  p.chunks = p.r_chunks + chunks_of(s_rows, chunk_rows);
  for (int i = 0; i < SLOTS; i++) p.slot[i] = slots[i];
  pthread_mutex_init(&p.mu, NULL);
  pthread_cond_init(&p.cv, NULL);
  pthread_t thread;
  int rc = pthread_create(&thread, NULL, reader, &p);
  CHECK(rc == 0, "starting the reader thread: %s", strerror(rc));
  table_t r = {0};
  if (op != SELECT) r = table_new(r_rows);
  for (uint64_t k = 0; k < p.chunks; k++) {
    int slot = (int)(k % SLOTS);
    double t0 = now_ms();
    pthread_mutex_lock(&p.mu);
    while (!p.full[slot]) pthread_cond_wait(&p.cv, &p.mu);
    size_t n = p.rows[slot];
    pthread_mutex_unlock(&p.mu);
    double t1 = now_ms();
    if (k < p.r_chunks)
      table_insert(&r, p.slot[slot], n);
    else
      run_op(op, &r, p.slot[slot], n, out, &a);
    double t2 = now_ms();
    t->stall += t1 - t0;
    t->compute += t2 - t1;
    pthread_mutex_lock(&p.mu);
    p.full[slot] = 0;
    pthread_cond_broadcast(&p.cv);
    pthread_mutex_unlock(&p.mu);
  }
  pthread_join(thread, NULL);
  pthread_mutex_destroy(&p.mu);
  pthread_cond_destroy(&p.cv);
  if (op != SELECT) table_free(&r);
  t->transfer = p.transfer;
  t->total = now_ms() - start;
  return a;
}

/* The same operator over the tables in this process's memory: the answer
 * every run must give. */
static answer_t reference(enum op op, const tuple_t *r_rows_data, uint64_t r_rows,
                          const tuple_t *s, uint64_t s_rows, size_t chunk_rows, tuple_t *out) {
  answer_t a = {0, 0};
  table_t r = {0};
  if (op != SELECT) {
    r = table_new(r_rows);
    table_insert(&r, r_rows_data, (size_t)r_rows);
  }
  for (uint64_t i = 0; i < s_rows; i += chunk_rows) {
    size_t n = (size_t)(s_rows - i < chunk_rows ? s_rows - i : chunk_rows);
    run_op(op, &r, s + i, n, out, &a);
  }
  if (op != SELECT) table_free(&r);
  return a;
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: relational [--tuples N[,N...]] [--r-tuples N] [--chunk BYTES] [--nodes LIST]\n"
          "                  [--reps R] [--dir DIR]\n"
          "  --tuples LIST  sizes of S to run, in tuples of 8 bytes (default 4M,16M,64M)\n"
          "  --r-tuples N   tuples in R (default 1M)\n"
          "  --chunk BYTES  bytes moved per transfer (default 4M)\n"
          "  --nodes LIST   nodes that hold the remote tables (default node-1,node-2)\n"
          "  --reps R       repetitions; the table shows medians (default 3, at most %d)\n"
          "  --dir DIR      where the table files go (default $TMPDIR or /tmp)\n",
          MAX_REPS);
}

int main(int argc, char **argv) {
  uint64_t sizes[MAX_SIZES] = {4u << 20, 16u << 20, 64u << 20};
  size_t n_sizes = 3;
  uint64_t r_rows = 1u << 20, chunk = 4u << 20, reps = 3;
  char default_nodes[] = "node-1,node-2";
  char *node_list = default_nodes;
  const char *dir = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
  static const struct option opts[] = {
      {"tuples", required_argument, NULL, 't'}, {"r-tuples", required_argument, NULL, 'R'},
      {"chunk", required_argument, NULL, 'c'},  {"nodes", required_argument, NULL, 'n'},
      {"reps", required_argument, NULL, 'r'},   {"dir", required_argument, NULL, 'D'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    switch (c) {
      case 't':
        n_sizes = 0;
        for (char *tok = strtok(optarg, ","); tok != NULL; tok = strtok(NULL, ",")) {
          if (n_sizes == MAX_SIZES) {
            fprintf(stderr, "error: --tuples: at most %d sizes\n", MAX_SIZES);
            return 2;
          }
          sizes[n_sizes++] = parse_count("--tuples", tok);
        }
        break;
      case 'R': r_rows = parse_count("--r-tuples", optarg); break;
      case 'c': chunk = parse_count("--chunk", optarg); break;
      case 'n': node_list = optarg; break;
      case 'r': reps = parse_count("--reps", optarg); break;
      case 'D': dir = optarg; break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind != argc || n_sizes == 0 || reps > MAX_REPS || r_rows > UINT32_MAX / 2 ||
      chunk < sizeof(tuple_t)) {
    usage(stderr);
    return 2;
  }
  const char *nodes[MAX_NODES];
  size_t n_nodes = split_nodes(node_list, nodes, MAX_NODES);
  uint64_t s_max = 0;
  for (size_t i = 0; i < n_sizes; i++) s_max = sizes[i] > s_max ? sizes[i] : s_max;
  size_t chunk_rows = (size_t)(chunk / sizeof(tuple_t));

  /* The tables, generated here once; every size uses a prefix of S. */
  tuple_t *r = malloc(r_rows * sizeof(tuple_t));
  tuple_t *s = malloc(s_max * sizeof(tuple_t));
  tuple_t *slots[SLOTS];
  for (int i = 0; i < SLOTS; i++) {
    slots[i] = malloc(chunk_rows * sizeof(tuple_t));
    CHECK(slots[i] != NULL, "out of memory for the chunk buffers");
  }
  tuple_t *out = malloc(chunk_rows * sizeof(tuple_t));
  CHECK(r && s && out, "out of memory for the tables");
  uint64_t rng = 42;
  for (uint64_t i = 0; i < r_rows; i++) r[i] = (tuple_t){(uint32_t)i, 0};
  for (uint64_t i = r_rows - 1; i > 0; i--) { /* Fisher-Yates */
    uint64_t j = next_random(&rng) % (i + 1);
    uint32_t k = r[i].key;
    r[i].key = r[j].key;
    r[j].key = k;
  }
  for (uint64_t i = 0; i < r_rows; i++) r[i].val = (uint32_t)(next_random(&rng) % VAL_RANGE);
  for (uint64_t i = 0; i < s_max; i++)
    s[i] = (tuple_t){(uint32_t)(next_random(&rng) % (2 * r_rows)),
                     (uint32_t)(next_random(&rng) % VAL_RANGE)};

  size_t r_len = r_rows * sizeof(tuple_t), s_len = s_max * sizeof(tuple_t);
  OCM(ocm_init());
  store_t st;
  double t0 = now_ms();
  st.remote_r = alloc_remote(r_len, nodes, n_nodes);
  st.remote_s = alloc_remote(s_len, nodes, n_nodes);
  OCM(ocm_copy_in(st.remote_r, 0, r, r_len));
  OCM(ocm_copy_in(st.remote_s, 0, s, s_len));
  double t1 = now_ms();
  st.file_r = table_file(dir, r, r_len);
  st.file_s = table_file(dir, s, s_len);
  double t2 = now_ms();
  double mib = (double)(r_len + s_len) / (1 << 20);
  printf("relational: R = %" PRIu64 " tuples, S up to %" PRIu64 " tuples (8 B each), %.0f MiB in all;"
         " %" PRIu64 " KiB chunks; median of %" PRIu64 "\n",
         r_rows, s_max, mib, chunk >> 10, reps);
  printf("loaded into remote memory on");
  for (size_t i = 0; i < n_nodes; i++) printf(" %s", nodes[i]);
  printf(" in %.0f ms; into files in %s in %.0f ms (written and synced)\n\n", t1 - t0, dir,
         t2 - t1);

  printf("%-7s %9s %-14s %12s %9s %11s %9s %8s %12s %9s\n", "OP", "S TUPLES", "SOURCE",
         "TRANSFER ms", "STALL ms", "COMPUTE ms", "TOTAL ms", "IN GB/s", "vs COLD FILE",
         "ROWS OUT");
  for (size_t z = 0; z < n_sizes; z++) {
    for (int op = 0; op < OPS; op++) {
      answer_t want = reference((enum op)op, r, r_rows, s, sizes[z], chunk_rows, out);
      double in_bytes = (double)(sizes[z] + (op == SELECT ? 0 : r_rows)) * sizeof(tuple_t);
      timing_t med[SOURCES];
      for (int src = 0; src < SOURCES; src++) {
        double tr[MAX_REPS], stall[MAX_REPS], co[MAX_REPS], to[MAX_REPS];
        for (uint64_t k = 0; k < reps; k++) {
          timing_t t;
          answer_t got = run(&st, (enum source)src, (enum op)op, r_rows, sizes[z], chunk_rows,
                             slots, out, &t);
          CHECK(got.rows == want.rows && got.sum == want.sum,
                "%s from %s gave %" PRIu64 " rows (checksum %" PRIu64 "), expected %" PRIu64
                " (%" PRIu64 ")",
                op_names[op], source_names[src], got.rows, got.sum, want.rows, want.sum);
          tr[k] = t.transfer;
          stall[k] = t.stall;
          co[k] = t.compute;
          to[k] = t.total;
        }
        med[src] = (timing_t){median(tr, reps), median(stall, reps), median(co, reps),
                              median(to, reps)};
      }
      for (int src = 0; src < SOURCES; src++) {
        char tuples[32];
        if (sizes[z] % (1u << 20) == 0)
          snprintf(tuples, sizeof tuples, "%" PRIu64 "M", sizes[z] >> 20);
        else
          snprintf(tuples, sizeof tuples, "%" PRIu64, sizes[z]);
        printf("%-7s %9s %-14s %12.1f %9.1f %11.1f %9.1f %8.2f %11.2fx %9" PRIu64 "\n",
               src == 0 ? op_names[op] : "", src == 0 ? tuples : "", source_names[src],
               med[src].transfer, med[src].stall, med[src].compute, med[src].total,
               in_bytes / (med[src].total * 1e6), med[FILE_COLD].total / med[src].total,
               want.rows);
      }
    }
  }
  printf("\nevery run's rows and checksum equal the same operator over the tables in memory\n");
  OCM(ocm_free(st.remote_r));
  OCM(ocm_free(st.remote_s));
  OCM(ocm_tini());
  close(st.file_r);
  close(st.file_s);
  free(r);
  free(s);
  for (int i = 0; i < SLOTS; i++) free(slots[i]);
  free(out);
  return 0;
}
