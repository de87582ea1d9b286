// Capabilities that tests make by hand, as the coordinator would grant
// them. Test-only.
#ifndef TESSERA_CORE_TESTING_GRANTS_H_
#define TESSERA_CORE_TESTING_GRANTS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "core/capability.h"

namespace tessera {
namespace testing {

// What hand-made grants share with the shards tests allocate by hand: the
// change id of the put whose shards they write (a write grant names its
// put, core/capability.h).
inline constexpr uint64_t kTestChange = 7;

// What the coordinator would grant on version 1 of `tensor` at worker "w0":
// `rights` (of change `change`) for an hour, minted under `key`.
inline std::string MintTestGrant(absl::string_view key,
                                 uint32_t rights = kRightRead,
                                 const std::string& tensor = "t",
                                 uint64_t change = 0) {
  Capability grant;
  grant.worker = "w0";
  grant.tensor = tensor;
  grant.version = 1;
  grant.change = change;
  grant.rights = rights;
  grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
  return MintCapability(grant, key);
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_CORE_TESTING_GRANTS_H_
