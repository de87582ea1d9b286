#ifndef TESSERA_OPS_HEAP_H_
#define TESSERA_OPS_HEAP_H_

namespace tessera {

// Keeps the heap's freed message buffers for reuse instead of handing them
// back to the kernel after each message. glibc's defaults trim a heap top
// past 2x the largest freed mmap'd chunk and map large blocks afresh, so a
// stream of 1 MiB gRPC messages faults in and zeroes new pages for every
// message; on a VM whose balloon reports freed pages to the host, each of
// those is also a host fault (bench/ figure 7: TLS gather 0.47x -> 0.62x of
// bare TLS). What a heap keeps is bounded by its peak use, and per arena by
// the trim threshold (64 MiB). Does nothing where the operator tuned malloc
// already (GLIBC_TUNABLES or MALLOC_TRIM_THRESHOLD_/MALLOC_MMAP_THRESHOLD_).
void RetainFreedBuffers();

}  // namespace tessera

#endif  // TESSERA_OPS_HEAP_H_
