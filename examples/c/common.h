/* What the C examples share: a monotonic clock, the exit-on-error check
 * that prints liboncilla's own message, option parsing for counts ("1M")
 * and node lists, a deterministic random generator, and the median that
 * every table reports. Header-only so each example is one `cc` command. */
#ifndef ONCILLA_EXAMPLES_COMMON_H
#define ONCILLA_EXAMPLES_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oncilla.h"

/* Exits with the message and the call site. */
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "error: ");                                          \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);                   \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

/* As CHECK, for a liboncilla call: adds its status and message. */
#define CHECK_OCM(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "error: ");                                          \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, ": %s: %s (%s:%d)\n", ocm_strerror(ocm_last_error()), \
              ocm_last_error_message(), __FILE__, __LINE__);               \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

/* Exits on a failed liboncilla call, naming it. */
#define OCM(call) CHECK_OCM((call) == OCM_OK, "%s", #call)

static inline double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* "1048576", "1M", "64K", "2G" (binary multiples); exits on anything else. */
static inline uint64_t parse_count(const char *what, const char *s) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mul = 1;
  if (end != NULL && *end != '\0') {
    switch (*end) {
      case 'K': case 'k': mul = 1ull << 10; break;
      case 'M': case 'm': mul = 1ull << 20; break;
      case 'G': case 'g': mul = 1ull << 30; break;
      default: mul = 0; break;
    }
    if (end[1] != '\0') mul = 0;
  }
  if (errno != 0 || end == s || mul == 0 || v == 0 || v > UINT64_MAX / mul) {
    fprintf(stderr, "error: %s: '%s' is not a positive count (e.g. 1M)\n", what, s);
    exit(2);
  }
  return (uint64_t)v * mul;
}

/* Splits "node-1,node-2" in place into at most `max` names; returns how many. */
static inline size_t split_nodes(char *list, const char **names, size_t max) {
  size_t n = 0;
  for (char *tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ",")) {
    if (n == max) {
      fprintf(stderr, "error: --nodes: at most %zu nodes\n", max);
      exit(2);
    }
    names[n++] = tok;
  }
  if (n == 0) {
    fprintf(stderr, "error: --nodes: no node names\n");
    exit(2);
  }
  return n;
}

/* xorshift64*: the same inputs on every machine and every run. */
static inline uint64_t next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of `n` samples (sorts them). */
static inline double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* A remote host allocation of `size` bytes shared equally by `nodes`. */
static inline ocm_alloc_t alloc_remote(uint64_t size, const char *const *nodes,
                                       size_t n_nodes) {
  ocm_params_t p = ocm_params_default(size, OCM_REMOTE_HOST);
  p.nodes = nodes;
  p.n_nodes = n_nodes;
  ocm_alloc_t a = ocm_alloc_ex(&p);
  CHECK_OCM(a != NULL, "allocating %llu bytes of remote memory", (unsigned long long)size);
  return a;
}

#endif
