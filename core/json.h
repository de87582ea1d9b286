// JSON string literals, written once: the CLI's --json output and the
// daemons' JSON log lines both escape text through here.
#ifndef TESSERA_CORE_JSON_H_
#define TESSERA_CORE_JSON_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tessera {

// `text` escaped for the inside of a JSON string: quote, backslash and
// control characters (\n \r \t \b \f, others as \u00XX); other bytes as
// they are.
std::string JsonEscape(absl::string_view text);

// `text` as a JSON string literal, quotes included.
std::string JsonString(absl::string_view text);

}  // namespace tessera

#endif  // TESSERA_CORE_JSON_H_
