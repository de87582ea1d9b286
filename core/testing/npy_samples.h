// Sample .npy files for the tests of the readers (core/npy, client's
// ReadNpyFile, the CLI's put). Test-only.
#ifndef TESSERA_CORE_TESTING_NPY_SAMPLES_H_
#define TESSERA_CORE_TESTING_NPY_SAMPLES_H_

#include <string>

namespace tessera {
namespace testing {

// A 118-byte .npy file (version 1.0) whose legal header declares 2^47
// float32 elements (512 TiB) and which holds no data: a reader must find
// it truncated before allocating.
inline std::string HugeHeaderNpyFile() {
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (140737488355328,), "
      "}";
  dict.append(118 - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string file("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(dict.size() & 0xff));
  file.push_back(static_cast<char>(dict.size() >> 8));
  return file + dict;
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_CORE_TESTING_NPY_SAMPLES_H_
