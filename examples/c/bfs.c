/* Breadth-first search over a graph whose adjacency (CSR offsets) and edge
 * arrays live in remote memory: the Oncilla paper's port of SHOC BFS, on
 * the CPU. The port took three steps, each visible below (PORT 1..3):
 *
 *   1. the working arrays the search runs on, malloc'd in the original,
 *      become Oncilla allocations of local host memory (ocm_localbuf gives
 *      the pointer the unchanged kernel uses);
 *   2. the graph and the result get a home in remote memory on other nodes
 *      (ocm_alloc_ex of OCM_REMOTE_HOST);
 *   3. every memcpy between the two becomes ocm_copy.
 *
 * Each repetition runs the original (malloc + memcpy) and the port on the
 * same generated graph, checks that both produce the same cost (level)
 * array and that it is a valid BFS, and times the phases the paper's
 * Figure 12 splits: init, transfer in, compute, transfer out, teardown
 * (plus the one-time load of the graph into remote memory). The table
 * shows the median of the repetitions.
 *
 * Run against a local cluster:  examples/c/run.sh bfs [--vertices 1M] ...
 * On a cluster: liboncilla's environment (ONCILLA_SOCKET, a token) set,
 *   bfs --nodes NAME[,NAME...] naming nodes other than this one. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <inttypes.h>

#include "common.h"

#define MAX_NODES 16
#define MAX_REPS 20

/* The graph as generated: CSR, vertex v's neighbours are
 * edges[offsets[v] .. offsets[v + 1]). */
typedef struct {
  uint32_t vertices;
  uint64_t edge_count;
  uint32_t *offsets; /* vertices + 1 */
  uint32_t *edges;
} graph_t;

enum { INIT, LOAD, XFER_IN, COMPUTE, XFER_OUT, TEARDOWN, PHASES };
static const char *phase_names[PHASES] = {
    "init", "load (graph -> remote)", "transfer in", "compute", "transfer out", "teardown"};

/* Each vertex gets 1 .. 2*degree-1 neighbours (mean `degree`), the first
 * its successor so every vertex is reachable from 0, the rest uniform. */
static graph_t generate(uint32_t n, uint32_t degree, uint64_t seed) {
  graph_t g = {.vertices = n};
  g.offsets = malloc(((size_t)n + 1) * sizeof(uint32_t));
  CHECK(g.offsets != NULL, "out of memory for %" PRIu32 " offsets", n);
  uint64_t rng = seed;
  uint64_t total = 0;
  for (uint32_t v = 0; v < n; v++) {
    g.offsets[v] = (uint32_t)total;
    total += 1 + next_random(&rng) % (2ull * degree - 1);
    CHECK(total < UINT32_MAX, "more than 2^32 edges: use fewer vertices or a lower degree");
  }
  g.offsets[n] = (uint32_t)total;
  g.edge_count = total;
  g.edges = malloc(total * sizeof(uint32_t));
  CHECK(g.edges != NULL, "out of memory for %" PRIu64 " edges", total);
  for (uint32_t v = 0; v < n; v++) {
    uint32_t e = g.offsets[v];
    g.edges[e++] = (v + 1) % n;
    for (; e < g.offsets[v + 1]; e++) g.edges[e] = (uint32_t)(next_random(&rng) % n);
  }
  return g;
}

/* The kernel, unchanged by the port: level-synchronous BFS from vertex 0
 * with a FIFO queue. Returns the number of levels. */
static uint32_t bfs(uint32_t n, const uint32_t *offsets, const uint32_t *edges,
                    int32_t *cost, uint32_t *queue) {
  for (uint32_t v = 0; v < n; v++) cost[v] = -1;
  uint32_t head = 0, tail = 0;
  cost[0] = 0;
  queue[tail++] = 0;
  while (head < tail) {
    uint32_t v = queue[head++];
    int32_t next = cost[v] + 1;
    for (uint32_t e = offsets[v]; e < offsets[v + 1]; e++) {
      uint32_t w = edges[e];
      if (cost[w] < 0) {
        cost[w] = next;
        queue[tail++] = w;
      }
    }
  }
  return (uint32_t)cost[queue[tail - 1]] + 1;
}

/* The original program: working arrays from malloc, memcpy in and out.
 * `at[p]` is when phase p began, `at[PHASES]` when the run ended (it has
 * no load: the graph is already in this process). */
static uint32_t run_local(const graph_t *g, int32_t *result, double at[PHASES + 1]) {
  size_t off_len = ((size_t)g->vertices + 1) * sizeof(uint32_t);
  size_t edge_len = g->edge_count * sizeof(uint32_t);
  size_t cost_len = (size_t)g->vertices * sizeof(int32_t);
  at[INIT] = now_ms();
  uint32_t *offsets = malloc(off_len);
  uint32_t *edges = malloc(edge_len);
  int32_t *cost = malloc(cost_len);
  uint32_t *queue = malloc((size_t)g->vertices * sizeof(uint32_t));
  CHECK(offsets && edges && cost && queue, "out of memory for the working arrays");
  at[LOAD] = at[XFER_IN] = now_ms();
  memcpy(offsets, g->offsets, off_len);
  memcpy(edges, g->edges, edge_len);
  at[COMPUTE] = now_ms();
  uint32_t levels = bfs(g->vertices, offsets, edges, cost, queue);
  at[XFER_OUT] = now_ms();
  memcpy(result, cost, cost_len);
  at[TEARDOWN] = now_ms();
  free(offsets);
  free(edges);
  free(cost);
  free(queue);
  at[PHASES] = now_ms();
  return levels;
}

/* The port: the same program with the three changes; `at` as for run_local. */
static uint32_t run_oncilla(const graph_t *g, const char *const *nodes, size_t n_nodes,
                            int32_t *result, double at[PHASES + 1]) {
  size_t off_len = ((size_t)g->vertices + 1) * sizeof(uint32_t);
  size_t edge_len = g->edge_count * sizeof(uint32_t);
  size_t cost_len = (size_t)g->vertices * sizeof(int32_t);
  at[INIT] = now_ms();
  OCM(ocm_init());
  /* PORT 1: the working arrays are local Oncilla allocations. */
  ocm_alloc_t offsets = ocm_alloc(off_len, OCM_LOCAL_HOST);
  ocm_alloc_t edges = ocm_alloc(edge_len, OCM_LOCAL_HOST);
  ocm_alloc_t cost = ocm_alloc(cost_len, OCM_LOCAL_HOST);
  CHECK_OCM(offsets && edges && cost, "allocating the working arrays on this node");
  uint32_t *queue = malloc((size_t)g->vertices * sizeof(uint32_t));
  CHECK(queue != NULL, "out of memory for the queue");
  /* PORT 2: the graph and the result live in remote memory. */
  ocm_alloc_t r_offsets = alloc_remote(off_len, nodes, n_nodes);
  ocm_alloc_t r_edges = alloc_remote(edge_len, nodes, n_nodes);
  ocm_alloc_t r_cost = alloc_remote(cost_len, nodes, n_nodes);
  at[LOAD] = now_ms();
  /* The graph reaches its remote home once (another process could have
   * put it there and named it; this one attaches nothing). */
  OCM(ocm_copy_in(r_offsets, 0, g->offsets, off_len));
  OCM(ocm_copy_in(r_edges, 0, g->edges, edge_len));
  at[XFER_IN] = now_ms();
  /* PORT 3: memcpy becomes ocm_copy. */
  OCM(ocm_copy(offsets, 0, r_offsets, 0, off_len));
  OCM(ocm_copy(edges, 0, r_edges, 0, edge_len));
  at[COMPUTE] = now_ms();
  uint32_t levels = bfs(g->vertices, ocm_localbuf(offsets), ocm_localbuf(edges),
                        ocm_localbuf(cost), queue);
  at[XFER_OUT] = now_ms();
  OCM(ocm_copy(r_cost, 0, cost, 0, cost_len));
  OCM(ocm_copy_out(r_cost, 0, result, cost_len));
  at[TEARDOWN] = now_ms();
  ocm_alloc_t all[] = {offsets, edges, cost, r_offsets, r_edges, r_cost};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) OCM(ocm_free(all[i]));
  free(queue);
  OCM(ocm_tini());
  at[PHASES] = now_ms();
  return levels;
}

/* A BFS answer is right when 0 is the source, every vertex is reached
 * (the generator chains them) and no edge skips a level. */
static void check_bfs(const graph_t *g, const int32_t *cost) {
  CHECK(cost[0] == 0, "the source's cost is %" PRId32 ", not 0", cost[0]);
  for (uint32_t v = 0; v < g->vertices; v++) {
    CHECK(cost[v] >= 0, "vertex %" PRIu32 " was not reached", v);
    for (uint32_t e = g->offsets[v]; e < g->offsets[v + 1]; e++)
      CHECK(cost[g->edges[e]] <= cost[v] + 1, "edge %" PRIu32 " -> %" PRIu32 " skips a level",
            v, g->edges[e]);
  }
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: bfs [--vertices N] [--degree D] [--nodes NAME,...] [--reps R] [--seed S]\n"
          "  --vertices N   vertices in the graph (default 1M)\n"
          "  --degree D     mean out-degree (default 8)\n"
          "  --nodes LIST   nodes that hold the remote arrays (default node-1,node-2)\n"
          "  --reps R       repetitions; the table shows medians (default 3, at most %d)\n"
          "  --seed S       graph generator seed (default 1)\n",
          MAX_REPS);
}

int main(int argc, char **argv) {
  uint64_t vertices = 1u << 20, degree = 8, reps = 3, seed = 1;
  char default_nodes[] = "node-1,node-2";
  char *node_list = default_nodes;
  static const struct option opts[] = {
      {"vertices", required_argument, NULL, 'v'}, {"degree", required_argument, NULL, 'd'},
      {"nodes", required_argument, NULL, 'n'},    {"reps", required_argument, NULL, 'r'},
      {"seed", required_argument, NULL, 's'},     {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    switch (c) {
      case 'v': vertices = parse_count("--vertices", optarg); break;
      case 'd': degree = parse_count("--degree", optarg); break;
      case 'n': node_list = optarg; break;
      case 'r': reps = parse_count("--reps", optarg); break;
      case 's': seed = parse_count("--seed", optarg); break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind != argc || vertices < 2 || vertices >= UINT32_MAX || degree > 1024 ||
      reps > MAX_REPS) {
    usage(stderr);
    return 2;
  }
  const char *nodes[MAX_NODES];
  size_t n_nodes = split_nodes(node_list, nodes, MAX_NODES);

  graph_t g = generate((uint32_t)vertices, (uint32_t)degree, seed);
  double graph_mib = (double)((g.vertices + 1 + g.edge_count) * sizeof(uint32_t)) / (1 << 20);
  printf("bfs: %" PRIu32 " vertices, %" PRIu64 " edges (%.1f MiB of offsets + edges), source 0\n",
         g.vertices, g.edge_count, graph_mib);
  printf("remote arrays on %zu node(s):", n_nodes);
  for (size_t i = 0; i < n_nodes; i++) printf(" %s", nodes[i]);
  printf("; %" PRIu64 " repetition(s)\n", reps);

  size_t cost_len = (size_t)g.vertices * sizeof(int32_t);
  int32_t *local_cost = malloc(cost_len);
  int32_t *ocm_cost = malloc(cost_len);
  CHECK(local_cost && ocm_cost, "out of memory for the results");
  double local_at[MAX_REPS][PHASES + 1], ocm_at[MAX_REPS][PHASES + 1];
  uint32_t levels = 0;
  for (uint64_t r = 0; r < reps; r++) {
    levels = run_local(&g, local_cost, local_at[r]);
    memset(ocm_cost, 0xff, cost_len);
    uint32_t ocm_levels = run_oncilla(&g, nodes, n_nodes, ocm_cost, ocm_at[r]);
    CHECK(ocm_levels == levels, "levels differ: %" PRIu32 " local, %" PRIu32 " oncilla", levels,
          ocm_levels);
    CHECK(memcmp(local_cost, ocm_cost, cost_len) == 0,
          "the cost array read back from remote memory differs from the local run's");
  }
  check_bfs(&g, local_cost);
  printf("result: %" PRIu32 " levels, all %" PRIu32
         " vertices reached; the port's cost array equals the local run's in every repetition\n\n",
         levels, g.vertices);

  double total_local = 0, total_ocm = 0, compute_ocm = 0;
  printf("%-24s %12s %12s\n", "PHASE (median ms)", "LOCAL", "ONCILLA");
  for (int p = 0; p < PHASES; p++) {
    double l[MAX_REPS], o[MAX_REPS];
    for (uint64_t r = 0; r < reps; r++) {
      l[r] = local_at[r][p + 1] - local_at[r][p];
      o[r] = ocm_at[r][p + 1] - ocm_at[r][p];
    }
    double ml = median(l, reps), mo = median(o, reps);
    if (p == LOAD) {
      printf("%-24s %12s %12.2f\n", phase_names[p], "-", mo);
      continue;
    }
    total_local += ml;
    total_ocm += mo;
    if (p == COMPUTE) compute_ocm = mo;
    printf("%-24s %12.2f %12.2f\n", phase_names[p], ml, mo);
  }
  printf("%-24s %12.2f %12.2f\n", "total (without load)", total_local, total_ocm);
  printf("oncilla overhead: %+.1f%% of the local run's total (%.2f ms); compute is %.0f%% of the port's total\n",
         100.0 * (total_ocm - total_local) / total_local, total_ocm - total_local,
         100.0 * compute_ocm / total_ocm);
  free(local_cost);
  free(ocm_cost);
  free(g.offsets);
  free(g.edges);
  return 0;
}
