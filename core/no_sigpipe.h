// Writes to a socket or pipe whose reader has gone raise SIGPIPE, which
// ends a process that does not ignore it. The daemons and the CLI ignore
// it; libraries (the SDK inside a user's process, OpenSSL writing with
// write(2)) cannot rely on that, so they block it around such writes.
#ifndef TESSERA_CORE_NO_SIGPIPE_H_
#define TESSERA_CORE_NO_SIGPIPE_H_

#include <signal.h>

namespace tessera {

// SIGPIPE blocked on this thread for the scope, and one raised meanwhile
// taken back (the write itself fails with EPIPE).
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe();
  ~ScopedNoSigpipe();
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace tessera

#endif  // TESSERA_CORE_NO_SIGPIPE_H_
