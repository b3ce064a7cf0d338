// `entente`: the one executable (see broker/cli.h for its commands).
#include <malloc.h>

#include "broker/cli.h"

int main(int argc, char** argv) {
  // Batches, log records and frames are often larger than glibc's default
  // mmap threshold (128 KiB, raised only as such blocks are freed), so each
  // one was mapped, faulted in page by page and unmapped again: up to a
  // fifth of a busy node's time went to page faults. Serving them from the
  // heap, and keeping up to 256 MiB of freed heap for reuse, removes that.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return entente::broker::run_cli(argc, argv);
}
