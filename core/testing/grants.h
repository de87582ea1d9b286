// What tests' hand-made capabilities share with the shards they allocate
// by hand: the change id of the put whose shards they write (a write grant
// names its put, core/capability.h).
#ifndef TESSERA_CORE_TESTING_GRANTS_H_
#define TESSERA_CORE_TESTING_GRANTS_H_

#include <cstdint>

namespace tessera {
namespace testing {

inline constexpr uint64_t kTestChange = 7;

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_CORE_TESTING_GRANTS_H_
