#include "ops/heap.h"

#include <malloc.h>

#include <cstdlib>
#include <initializer_list>

namespace tessera {

void RetainFreedBuffers() {
  for (const char* tuned :
       {"GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"}) {
    if (std::getenv(tuned) != nullptr) return;
  }
#ifdef M_MMAP_THRESHOLD
  // Blocks below 32 MiB (glibc's own dynamic ceiling) come from the heap,
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // and a heap returns its free top to the kernel only past 64 MiB.
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace tessera
