// HostArray: a dense row-major array in host memory, as the SDK returns it.
// Move-only; the buffer is not zero-initialised (the SDK overwrites all of it).
#ifndef TESSERA_CLIENT_HOST_ARRAY_H_
#define TESSERA_CLIENT_HOST_ARRAY_H_

#include <cstdint>
#include <memory>

#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

struct HostArray {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::unique_ptr<char[]> buffer;
  int64_t num_bytes = 0;
  // Read from a tensor: the version whose bytes these are (0: not read).
  uint64_t version = 0;

  // Allocates an array of `shape` (the caller has checked the byte size).
  static HostArray Allocate(DType dtype, Shape shape);

  char* data() { return buffer.get(); }
  const char* data() const { return buffer.get(); }
  int64_t NumElements() const {
    return num_bytes / static_cast<int64_t>(ItemSize(dtype));
  }
  template <typename T>
  const T* As() const {
    return reinterpret_cast<const T*>(buffer.get());
  }
  template <typename T>
  T* As() {
    return reinterpret_cast<T*>(buffer.get());
  }
};

inline HostArray HostArray::Allocate(DType dtype, Shape shape) {
  HostArray array;
  array.dtype = dtype;
  int64_t n = static_cast<int64_t>(ItemSize(dtype));
  for (int64_t d : shape) n *= d;
  array.shape = std::move(shape);
  array.num_bytes = n;
  array.buffer.reset(new char[n > 0 ? n : 1]);
  return array;
}

}  // namespace tessera

#endif  // TESSERA_CLIENT_HOST_ARRAY_H_
