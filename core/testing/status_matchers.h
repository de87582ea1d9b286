// gMock matchers for absl::Status and absl::StatusOr<T>: IsOk(),
// StatusIs(code[, message_matcher]) and IsOkAndHolds(matcher). Abseil
// 20220623 has no absl_testing, so they are defined here. Test-only;
// stateless.
#ifndef TESSERA_CORE_TESTING_STATUS_MATCHERS_H_
#define TESSERA_CORE_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

class StatusIsMatcherCommon {
 public:
  StatusIsMatcherCommon(absl::StatusCode code,
                        ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const {
    *os << "has status code " << absl::StatusCodeToString(code_)
        << " and a message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have status code " << absl::StatusCodeToString(code_)
        << " or has a message that ";
    message_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(const absl::Status& s,
                       ::testing::MatchResultListener* listener) const {
    *listener << "whose status is " << s;
    if (s.code() != code_) return false;
    return message_.Matches(std::string(s.message()));
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

template <typename T>
class MonoStatusIsMatcher : public ::testing::MatcherInterface<T> {
 public:
  explicit MonoStatusIsMatcher(StatusIsMatcherCommon common)
      : common_(std::move(common)) {}
  void DescribeTo(std::ostream* os) const override { common_.DescribeTo(os); }
  void DescribeNegationTo(std::ostream* os) const override {
    common_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(
      T actual, ::testing::MatchResultListener* listener) const override {
    return common_.MatchAndExplain(GetStatus(actual), listener);
  }

 private:
  StatusIsMatcherCommon common_;
};

class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code,
                  ::testing::Matcher<const std::string&> message)
      : common_(code, std::move(message)) {}
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT
    return ::testing::Matcher<T>(new MonoStatusIsMatcher<T>(common_));
  }

 private:
  StatusIsMatcherCommon common_;
};

template <typename T>
class MonoIsOkMatcher : public ::testing::MatcherInterface<T> {
 public:
  void DescribeTo(std::ostream* os) const override { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "is not OK";
  }
  bool MatchAndExplain(
      T actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& s = GetStatus(actual);
    *listener << "whose status is " << s;
    return s.ok();
  }
};

class IsOkMatcher {
 public:
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT
    return ::testing::Matcher<T>(new MonoIsOkMatcher<T>());
  }
};

template <typename StatusOrType>
class MonoIsOkAndHoldsMatcher
    : public ::testing::MatcherInterface<StatusOrType> {
 public:
  using ValueType = typename std::remove_cv_t<
      std::remove_reference_t<StatusOrType>>::value_type;

  template <typename InnerMatcher>
  explicit MonoIsOkAndHoldsMatcher(InnerMatcher&& inner)
      : inner_(::testing::SafeMatcherCast<const ValueType&>(
            std::forward<InnerMatcher>(inner))) {}

  void DescribeTo(std::ostream* os) const override {
    *os << "is OK and has a value that ";
    inner_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "is not OK or has a value that ";
    inner_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(
      StatusOrType actual,
      ::testing::MatchResultListener* listener) const override {
    if (!actual.ok()) {
      *listener << "whose status is " << actual.status();
      return false;
    }
    ::testing::StringMatchResultListener inner_listener;
    const bool matches = inner_.MatchAndExplain(*actual, &inner_listener);
    const std::string explanation = inner_listener.str();
    if (!explanation.empty()) *listener << "whose value " << explanation;
    return matches;
  }

 private:
  ::testing::Matcher<const ValueType&> inner_;
};

template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}
  template <typename StatusOrType>
  operator ::testing::Matcher<StatusOrType>() const {  // NOLINT
    return ::testing::Matcher<StatusOrType>(
        new MonoIsOkAndHoldsMatcher<const StatusOrType&>(inner_));
  }

 private:
  InnerMatcher inner_;
};

}  // namespace internal

// Matches an ok absl::Status or absl::StatusOr<T>.
inline internal::IsOkMatcher IsOk() { return internal::IsOkMatcher(); }

// Matches a status (or StatusOr) whose code is `code` and whose message
// matches `message` (a string or a matcher such as HasSubstr("overlap")).
template <typename MessageMatcher>
internal::StatusIsMatcher StatusIs(absl::StatusCode code,
                                   MessageMatcher&& message) {
  return internal::StatusIsMatcher(code,
                                   ::testing::MatcherCast<const std::string&>(
                                       std::forward<MessageMatcher>(message)));
}
inline internal::StatusIsMatcher StatusIs(absl::StatusCode code) {
  return internal::StatusIsMatcher(code, ::testing::_);
}

// Matches an ok absl::StatusOr<T> whose value matches `inner`.
template <typename InnerMatcher>
internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>> IsOkAndHolds(
    InnerMatcher&& inner) {
  return internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>>(
      std::forward<InnerMatcher>(inner));
}

}  // namespace testing
}  // namespace tessera

// Assert/expect that a Status or StatusOr is OK; a failure prints the status.
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::tessera::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::tessera::testing::IsOk())

// ASSERT_OK_AND_ASSIGN(T x, expr): fails the test with the status unless
// the StatusOr `expr` is OK, else moves its value into `x`.
#define TESSERA_TESTING_CONCAT_INNER_(a, b) a##b
#define TESSERA_TESTING_CONCAT_(a, b) TESSERA_TESTING_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(           \
      TESSERA_TESTING_CONCAT_(status_or_value_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  ASSERT_TRUE(statusor.ok()) << statusor.status();      \
  lhs = std::move(*statusor)

#endif  // TESSERA_CORE_TESTING_STATUS_MATCHERS_H_
