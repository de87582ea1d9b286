// Waiting for SIGTERM/SIGINT without async-signal-unsafe handlers: the signals
// are blocked in every thread and received synchronously with sigwait.
#ifndef TESSERA_RPC_SIGNALS_H_
#define TESSERA_RPC_SIGNALS_H_

namespace tessera {

// Call first thing in main(), before any thread starts, so that every thread
// inherits the blocked mask.
void BlockTerminationSignals();

// Blocks until SIGTERM or SIGINT arrives; returns the signal number.
int WaitForTerminationSignal();

}  // namespace tessera

#endif  // TESSERA_RPC_SIGNALS_H_
