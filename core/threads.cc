#include "core/threads.h"

#include <cerrno>
#include <system_error>
#include <utility>

namespace tessera {

std::optional<std::thread> TryStartThread(std::function<void()> fn) {
  try {
    return std::thread(std::move(fn));
  } catch (const std::system_error& e) {
    errno = e.code().value();
    return std::nullopt;
  }
}

}  // namespace tessera
