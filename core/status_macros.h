// Status propagation helpers: TESSERA_RETURN_IF_ERROR, TESSERA_ASSIGN_OR_RETURN
// and Annotate(). Our Abseil (20220623) has no ABSL_RETURN_IF_ERROR, so these
// are defined once here. Stateless; safe to use from any thread.
#ifndef TESSERA_CORE_STATUS_MACROS_H_
#define TESSERA_CORE_STATUS_MACROS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

// Returns `s` with `context` prefixed to its message ("context: message"),
// keeping the code and payloads. An ok status stays ok.
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok() || context.empty()) return s;
  absl::Status out(s.code(), absl::StrCat(context, ": ", s.message()));
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

}  // namespace tessera

#define TESSERA_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define TESSERA_STATUS_MACROS_CONCAT_(x, y) \
  TESSERA_STATUS_MACROS_CONCAT_INNER_(x, y)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function if it is not ok.
#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const ::absl::Status tessera_status_ = (expr);     \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs`, which may be a declaration
// (`auto x`, `Box b`) or an existing lvalue.
#define TESSERA_ASSIGN_OR_RETURN(lhs, rexpr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(            \
      TESSERA_STATUS_MACROS_CONCAT_(tessera_statusor_, __LINE__), lhs, rexpr)

#define TESSERA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // TESSERA_CORE_STATUS_MACROS_H_
