// Threads started on demand, for daemons that must not die when the system
// has none to give. std::thread reports a failed clone (EAGAIN: the
// process's or its container's limit on tasks, RLIMIT_NPROC, or memory) by
// throwing, and an uncaught throw ends the process: a flood of connections,
// each served by a thread, would then kill the daemon instead of being
// refused.
#ifndef TESSERA_CORE_THREADS_H_
#define TESSERA_CORE_THREADS_H_

#include <functional>
#include <optional>
#include <thread>

namespace tessera {

// `fn` on a new thread, or nullopt (errno set) when none can be started.
std::optional<std::thread> TryStartThread(std::function<void()> fn);

}  // namespace tessera

#endif  // TESSERA_CORE_THREADS_H_
