/* Helpers shared by the tests. */
#ifndef ST_TESTUTIL_H
#define ST_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

/* One line "PASS ..." or "FAIL ..." naming what was compared, counted in the including file's
 * `static int n_pass, n_fail`. */
#define CHECK(ok, ...)                     \
  do {                                     \
    printf("%s ", (ok) ? "PASS" : "FAIL"); \
    printf(__VA_ARGS__);                   \
    printf("\n");                          \
    (ok) ? n_pass++ : n_fail++;            \
  } while (0)

/* Fills one row of n weights of `type` (st_row_bytes(type, n) bytes) with random bits, then sets
 * every value that must be finite (F32/F16/BF16 values, the fp16 scales of each block) to small
 * finite numbers, so any row decodes to finite weights. `rng` is xorshift64 state. */
void tu_random_row(uint32_t type, uint8_t *row, int64_t n, uint64_t *rng);

#endif
