// Changes between two versions of the same bytes (CLI.md "Mirrors (v4)":
// an update of a mirrored tensor relays only what changed). Between two
// steps of a trainer most elements of its weights are bit-identical, so a
// copy that holds version N needs only N+1's changed elements.
//
// The encoding is element-level: a list of runs, each
//   varint gap    unchanged elements since the previous run's end
//   varint count  changed elements
//   count * item  their new bytes
// (varints as in protobuf, LEB128). Two runs closer than a run's header are
// one, so a scattered change costs about item + 2 bytes per element.
#ifndef TESSERA_CORE_DELTA_CODEC_H_
#define TESSERA_CORE_DELTA_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera {

// The changes that make `base` into `next` (the same size, a whole number
// of `item`-byte elements), or nullopt when they would take more than
// `limit` bytes (the caller sends `next` whole then). Empty: no change.
std::optional<std::string> EncodeDelta(absl::string_view base,
                                       absl::string_view next, int64_t item,
                                       int64_t limit);

// Applies EncodeDelta's `encoding` to `data` (the base's bytes) in place.
// An encoding from outside is input: a malformed one (a varint too long, a
// run past the end of `data`, a truncated run) is DATA_LOSS, and `data`
// may then be partly changed (the caller discards it).
absl::Status ApplyDelta(absl::string_view encoding, int64_t item,
                        absl::Span<char> data);

}  // namespace tessera

#endif  // TESSERA_CORE_DELTA_CODEC_H_
