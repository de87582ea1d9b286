#include "ops/heap.h"

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr size_t kMessage = size_t{8} << 20;

// Keeps `block` and its contents observable: a compiler may otherwise drop
// a malloc/free pair whose memory nobody reads (clang does at -O1).
void Escape(void* block) { asm volatile("" : : "g"(block) : "memory"); }

// In a child (mallopt is process-wide): after `setup`, frees an 8 MiB block
// and allocates it again. Exit 0: neither block was mapped on its own and
// the freed one stayed in the heap (kept); 1: the block was mapped afresh or
// given back (not kept); 2: allocation failed.
template <typename Setup>
int KeptInChild(Setup setup) {
  const pid_t pid = fork();
  if (pid == 0) {
    setup();
    char* block = static_cast<char*>(std::malloc(kMessage));
    if (block == nullptr) _exit(2);
    std::memset(block, 1, kMessage);
    Escape(block);
    const bool mapped_first = mallinfo2().hblkhd >= kMessage;
    std::free(block);
    const bool kept = mallinfo2().fordblks >= kMessage;
    block = static_cast<char*>(std::malloc(kMessage));
    if (block == nullptr) _exit(2);
    Escape(block);
    const bool mapped_again = mallinfo2().hblkhd >= kMessage;
    std::free(block);
    _exit(!mapped_first && kept && !mapped_again ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(RetainFreedBuffersTest, AFreedMessageBufferStaysInTheHeap) {
  EXPECT_EQ(KeptInChild([] {
              unsetenv("GLIBC_TUNABLES");
              unsetenv("MALLOC_TRIM_THRESHOLD_");
              unsetenv("MALLOC_MMAP_THRESHOLD_");
              RetainFreedBuffers();
            }),
            0);
}

TEST(RetainFreedBuffersTest, GlibcDefaultsMapTheSameBufferAfresh) {
  // What the setting changes: without it the block is mapped on its own.
  EXPECT_EQ(KeptInChild([] {}), 1);
}

TEST(RetainFreedBuffersTest, AnOperatorsMallocSettingIsLeftAlone) {
  EXPECT_EQ(KeptInChild([] {
              setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
              RetainFreedBuffers();
            }),
            1);
}

}  // namespace
}  // namespace tessera
