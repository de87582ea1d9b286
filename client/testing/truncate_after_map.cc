// Test helper, LD_PRELOAD'ed into a `tessera` CLI or Python process: what
// another process shrinking an input while it is read does, made
// deterministic. $TESSERA_TEST_TRUNCATE_AFTER_MAP names the file and the
// size to cut it to, and when:
//
//   PATH:SIZE          right after the process maps PATH (read-only,
//                      shared), before it reads a byte of it;
//   PATH:SIZE:connect  at the process's first connect(2) after that: once
//                      the file is open and its header checked, when the
//                      client dials the cluster, before it reads the data.
//
// Once. (UCX's memory hooks patch mmap calls past any preload: run with
// UCX_MEM_MMAP_HOOK_MODE=none.)
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace {

std::atomic<bool> g_armed{false};  // PATH is mapped; cut at connect()
std::atomic<bool> g_done{false};

using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);
using ConnectFn = int (*)(int, const struct sockaddr*, socklen_t);

// Whether `fd` is the file at `path`; no allocation (mmap may be called by
// malloc itself, though never for a file).
bool IsFile(int fd, const char* path) {
  char wanted[PATH_MAX];
  if (realpath(path, wanted) == nullptr) return false;
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char actual[PATH_MAX];
  const ssize_t n = readlink(link, actual, sizeof(actual) - 1);
  if (n <= 0) return false;
  actual[n] = '\0';
  return strcmp(actual, wanted) == 0;
}

struct Spec {
  char path[PATH_MAX];
  long long size = 0;
  bool at_connect = false;
};

bool ParseSpec(Spec* spec) {
  const char* text = getenv("TESSERA_TEST_TRUNCATE_AFTER_MAP");
  if (text == nullptr) return false;
  const char* end = text + strlen(text);
  spec->at_connect = end - text > 8 && strcmp(end - 8, ":connect") == 0;
  if (spec->at_connect) end -= 8;
  const char* colon = static_cast<const char*>(memrchr(text, ':', end - text));
  if (colon == nullptr || colon - text >= PATH_MAX) return false;
  memcpy(spec->path, text, colon - text);
  spec->path[colon - text] = '\0';
  spec->size = strtoll(colon + 1, nullptr, 10);
  return true;
}

void Truncate(const Spec& spec) {
  if (g_done.exchange(true)) return;
  if (truncate(spec.path, spec.size) != 0) {
    perror("truncate_after_map: truncate");
  }
}

void OnMapped(int fd) {
  Spec spec;
  if (g_done.load() || !ParseSpec(&spec) || !IsFile(fd, spec.path)) return;
  if (spec.at_connect) {
    g_armed.store(true);
  } else {
    Truncate(spec);
  }
}

}  // namespace

extern "C" void* mmap(void* addr, size_t length, int prot, int flags, int fd,
                      off_t offset) {
  static const MmapFn real = reinterpret_cast<MmapFn>(dlsym(RTLD_NEXT, "mmap"));
  void* mapped = real(addr, length, prot, flags, fd, offset);
  if (mapped != MAP_FAILED && fd >= 0 && (flags & MAP_SHARED) &&
      !(prot & PROT_WRITE)) {
    OnMapped(fd);
  }
  return mapped;
}

extern "C" int connect(int fd, const struct sockaddr* address,
                       socklen_t length) {
  static const ConnectFn real =
      reinterpret_cast<ConnectFn>(dlsym(RTLD_NEXT, "connect"));
  Spec spec;
  if (g_armed.load() && !g_done.load() && ParseSpec(&spec)) Truncate(spec);
  return real(fd, address, length);
}

extern "C" void* mmap64(void* addr, size_t length, int prot, int flags, int fd,
                        off_t offset) {
  return mmap(addr, length, prot, flags, fd, offset);
}
