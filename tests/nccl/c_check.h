/* What the C test programs of the NCCL API share: EXPECT(cond, format, ...)
 * reports a failed check with NCCL's last error and counts it in
 * `failures`. */
#ifndef BRAID_TESTS_NCCL_C_CHECK_H_
#define BRAID_TESTS_NCCL_C_CHECK_H_

#include <nccl.h>
#include <stdio.h>

static int failures = 0;

#define EXPECT(cond, ...)                              \
  do {                                                 \
    if (!(cond)) {                                     \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);  \
      fprintf(stderr, __VA_ARGS__);                    \
      fprintf(stderr, " (%s)\n", ncclGetLastError(0)); \
      ++failures;                                      \
    }                                                  \
  } while (0)

#endif /* BRAID_TESTS_NCCL_C_CHECK_H_ */
