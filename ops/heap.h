#ifndef TESSERA_OPS_HEAP_H_
#define TESSERA_OPS_HEAP_H_

namespace tessera {

// Keeps the heap's freed message buffers for reuse instead of handing them
// back to the kernel after each message. glibc maps blocks past 128 KiB
// afresh and trims a heap top past 128 KiB (both raised only as far as the
// largest mapped block freed so far), so a stream of 1 MiB gRPC messages
// faults in and zeroes new pages for nearly every message; on a VM whose
// balloon reports freed pages to the host, each of those is also a host
// fault (bench/ figure 7: the TLS gather went from 0.46-0.48x to 0.52-0.57x
// of bare TLS with the worker's heap alone). Blocks under 32 MiB then come
// from the heap, and a heap gives its free top back only past 64 MiB: what
// it keeps is bounded by its peak use, and per arena by 64 MiB. Process-
// wide, so only a program's main calls it (the worker, the CLI; never the
// SDK). Does nothing where the operator tuned malloc already
// (GLIBC_TUNABLES, MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ set).
void RetainFreedBuffers();

}  // namespace tessera

#endif  // TESSERA_OPS_HEAP_H_
