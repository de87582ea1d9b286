#include "core/npy.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/testing/npy_samples.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::HugeHeaderNpyFile;
using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Bytes written by NumPy 1.24 (np.save / numpy.lib.format), as hex.
struct EncodeCase {
  const char* descr;
  Shape shape;
  const char* numpy_header_hex;
};
const EncodeCase kEncodeCases[] = {
    {"<f4",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f8",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6638272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f2",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6632272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<u2",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c7532272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"|i1",
     {2, 3},
     "934e554d5059010076007b276465736372273a20277c6931272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"|u1",
     {2, 3},
     "934e554d5059010076007b276465736372273a20277c7531272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<i2",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6932272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<i4",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6934272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<i8",
     {2, 3},
     "934e554d5059010076007b276465736372273a20273c6938272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"|b1",
     {2, 3},
     "934e554d5059010076007b276465736372273a20277c6231272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
     "33292c207d202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f4",
     {3},
     "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028332c29"
     "2c207d2020202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f4",
     {0},
     "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028302c29"
     "2c207d2020202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f4",
     {123456789012345, 4},
     "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028313233"
     "3435363738393031323334352c2034292c207d20202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f4",
     {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
     "934e554d50590100b6007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a2028312c20"
     "322c20332c20342c20352c20362c20372c20382c20392c2031302c2031312c20"
     "31322c2031332c2031342c2031352c203136292c207d20202020202020202020"
     "2020202020202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020202020202020200a"},
    {"<f4",
     {12, 12, 12, 12, 12, 12, 12, 12, 12},
     "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
     "72616e5f6f72646572273a2046616c73652c20277368617065273a202831322c"
     "2031322c2031322c2031322c2031322c2031322c2031322c2031322c20313229"
     "2c207d202020202020202020202020202020202020202020202020202020200a"},
};

// np.save(np.arange(6, dtype='<f4').reshape(2, 3))
constexpr char kCFloat32Hex[] =
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
    "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
    "33292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a"
    "000000000000803f0000004000004040000080400000a040";
// np.save(np.arange(6, dtype='>i4').reshape(2, 3))
constexpr char kBigEndianInt32Hex[] =
    "934e554d5059010076007b276465736372273a20273e6934272c2027666f7274"
    "72616e5f6f72646572273a2046616c73652c20277368617065273a2028322c20"
    "33292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a"
    "000000000000000100000002000000030000000400000005";
// np.save(np.asfortranarray(np.arange(24, dtype='>f8').reshape(2, 3, 4)))
constexpr char kFortranBigEndianFloat64Hex[] =
    "934e554d5059010076007b276465736372273a20273e6638272c2027666f7274"
    "72616e5f6f72646572273a20547275652c20277368617065273a2028322c2033"
    "2c2034292c207d20202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a"
    "0000000000000000402800000000000040100000000000004030000000000000"
    "402000000000000040340000000000003ff0000000000000402a000000000000"
    "4014000000000000403100000000000040220000000000004035000000000000"
    "4000000000000000402c00000000000040180000000000004032000000000000"
    "402400000000000040360000000000004008000000000000402e000000000000"
    "401c000000000000403300000000000040260000000000004037000000000000";
// Headers of a (5,) '<i8' array in format versions 2.0 and 3.0.
constexpr char kVersion2HeaderHex[] =
    "934e554d50590200740000007b276465736372273a20273c6938272c2027666f"
    "727472616e5f6f72646572273a2046616c73652c20277368617065273a202835"
    "2c292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a";
constexpr char kVersion3HeaderHex[] =
    "934e554d50590300740000007b276465736372273a20273c6938272c2027666f"
    "727472616e5f6f72646572273a2046616c73652c20277368617065273a202835"
    "2c292c207d202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a";
// np.save(np.zeros((), dtype='<f4'))
constexpr char kZeroDimHex[] =
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f7274"
    "72616e5f6f72646572273a2046616c73652c20277368617065273a2028292c20"
    "7d20202020202020202020202020202020202020202020202020202020202020"
    "202020202020202020202020202020202020202020202020202020202020200a"
    "00000000";

std::string Bytes(const char* hex) { return absl::HexStringToBytes(hex); }

DType DTypeOfDescr(absl::string_view descr) {
  if (descr == "<f4") return DType::kFloat32;
  if (descr == "<f8") return DType::kFloat64;
  if (descr == "<f2") return DType::kFloat16;
  if (descr == "<u2") return DType::kUInt16;
  if (descr == "|i1") return DType::kInt8;
  if (descr == "|u1") return DType::kUInt8;
  if (descr == "<i2") return DType::kInt16;
  if (descr == "<i4") return DType::kInt32;
  if (descr == "<i8") return DType::kInt64;
  return DType::kBool;
}

TEST(NpyTest, EncodedHeadersAreByteForByteWhatNumPyWrites) {
  for (const EncodeCase& c : kEncodeCases) {
    const std::string header = EncodeNpyHeader(DTypeOfDescr(c.descr), c.shape);
    EXPECT_EQ(absl::BytesToHexString(header), c.numpy_header_hex)
        << c.descr << " " << ShapeToString(c.shape);
    EXPECT_EQ(header.size() % 64, 0u);
  }
}

// stdin is taken only as far as its header says: the size once the header
// is in, nothing before, an error as soon as the bytes are not a .npy file.
TEST(NpyTest, AStreamIsSizedByItsHeader) {
  const std::string header = EncodeNpyHeader(DType::kInt32, Shape{3, 5});
  for (size_t cut = 0; cut < header.size(); ++cut) {
    absl::StatusOr<std::optional<int64_t>> partial =
        NpyStreamBytes(header.substr(0, cut));
    ASSERT_TRUE(partial.ok()) << cut << ": " << partial.status();
    EXPECT_FALSE(partial->has_value()) << cut;
  }
  absl::StatusOr<std::optional<int64_t>> whole =
      NpyStreamBytes(header + std::string(7, '\0'));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->value(), static_cast<int64_t>(header.size()) + 60);
  // Zeros (cat /dev/zero) and text are refused at their first bytes.
  for (const std::string& junk :
       {std::string(1, '\0'), std::string("PK\3\4")}) {
    absl::StatusOr<std::optional<int64_t>> refused = NpyStreamBytes(junk);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("not a .npy file"),
              std::string::npos);
  }
  EXPECT_FALSE(NpyStreamBytes(std::string("\x93NUMPY\x09\x00", 8)).ok());
  // A header longer than any NumPy writes is not waited for.
  std::string huge("\x93NUMPY\x02\x00", 8);
  huge += std::string("\xff\xff\xff\x7f", 4);
  absl::StatusOr<std::optional<int64_t>> long_header = NpyStreamBytes(huge);
  ASSERT_FALSE(long_header.ok());
  EXPECT_NE(long_header.status().message().find("longer than"),
            std::string::npos);
}

TEST(NpyTest, EveryDTypeRoundTripsThroughItsHeader) {
  for (DType dtype : AllDTypes()) {
    for (const Shape& shape : {Shape{7}, Shape{2, 3}, Shape{0, 4}}) {
      const std::string header = EncodeNpyHeader(dtype, shape);
      auto parsed = ParseNpyHeader(header);
      ASSERT_THAT(parsed, IsOk()) << DTypeName(dtype);
      // bfloat16 and float8 are written as their raw words.
      EXPECT_EQ(parsed->dtype, NpyFileDType(dtype));
      EXPECT_EQ(NpyFileDType(dtype) != dtype,
                dtype == DType::kBFloat16 || dtype == DType::kFloat8E4M3FN ||
                    dtype == DType::kFloat8E5M2);
      EXPECT_EQ(parsed->shape, shape);
      EXPECT_FALSE(parsed->fortran_order);
      EXPECT_FALSE(parsed->byte_swapped);
      EXPECT_EQ(parsed->data_offset, header.size());
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      EXPECT_THAT(NpyDataBytes(*parsed),
                  IsOkAndHolds(numel * static_cast<int64_t>(ItemSize(dtype))));
    }
  }
}

TEST(NpyTest, HugeHeadersSwitchToVersionTwo) {
  const Shape shape(30000, 1);  // "(1, 1, ..." needs more than 65535 bytes
  const std::string header = EncodeNpyHeader(DType::kInt8, shape);
  EXPECT_EQ(header[6], '\x02');
  EXPECT_EQ(header.size() % 64, 0u);
  EXPECT_EQ(header.back(), '\n');
  auto parsed = ParseNpyHeader(header);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->shape, shape);
  EXPECT_EQ(parsed->data_offset, header.size());
}

TEST(NpyTest, ReadsACOrderFileWrittenByNumPy) {
  std::string file = Bytes(kCFloat32Hex);
  auto header = ParseNpyHeader(file);
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->dtype, DType::kFloat32);
  EXPECT_EQ(header->descr, "<f4");
  EXPECT_THAT(header->shape, ElementsAre(2, 3));
  EXPECT_EQ(header->data_offset, 128u);
  absl::Span<char> data(&file[header->data_offset],
                        file.size() - header->data_offset);
  ASSERT_THAT(NormalizeNpyData(*header, data), IsOk());
  float values[6];
  std::memcpy(values, data.data(), sizeof(values));
  EXPECT_THAT(values, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(NpyTest, BigEndianDataIsSwapped) {
  std::string file = Bytes(kBigEndianInt32Hex);
  auto header = ParseNpyHeader(file);
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->dtype, DType::kInt32);
  EXPECT_TRUE(header->byte_swapped);
  absl::Span<char> data(&file[header->data_offset], 24);
  ASSERT_THAT(NormalizeNpyData(*header, data), IsOk());
  int32_t values[6];
  std::memcpy(values, data.data(), sizeof(values));
  EXPECT_THAT(values, ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(NpyTest, FortranOrderBigEndianDataBecomesCOrder) {
  std::string file = Bytes(kFortranBigEndianFloat64Hex);
  auto header = ParseNpyHeader(file);
  ASSERT_THAT(header, IsOk());
  EXPECT_TRUE(header->fortran_order);
  EXPECT_TRUE(header->byte_swapped);
  EXPECT_THAT(header->shape, ElementsAre(2, 3, 4));
  absl::Span<char> data(&file[header->data_offset], 24 * 8);
  ASSERT_THAT(NormalizeNpyData(*header, data), IsOk());
  double values[24];
  std::memcpy(values, data.data(), sizeof(values));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(values[i], i) << i;
}

TEST(NpyTest, FortranOrderTransposesEveryItemSize) {
  for (DType dtype :
       {DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64}) {
    const size_t item = ItemSize(dtype);
    NpyArray header;
    header.dtype = dtype;
    header.shape = {3, 5};
    header.fortran_order = true;
    // Fortran layout: element (i, j) at j * 3 + i holds the C index i*5+j.
    std::vector<char> data(15 * item, 0);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 5; ++j) data[(j * 3 + i) * item] = i * 5 + j;
    }
    ASSERT_THAT(NormalizeNpyData(header, absl::MakeSpan(data)), IsOk());
    for (int k = 0; k < 15; ++k) EXPECT_EQ(data[k * item], k);
  }
}

TEST(NpyTest, VersionsTwoAndThreeParse) {
  for (const char* hex : {kVersion2HeaderHex, kVersion3HeaderHex}) {
    auto header = ParseNpyHeader(Bytes(hex));
    ASSERT_THAT(header, IsOk());
    EXPECT_EQ(header->dtype, DType::kInt64);
    EXPECT_THAT(header->shape, ElementsAre(5));
    EXPECT_EQ(header->data_offset, 128u);
  }
}

std::string WithDict(absl::string_view dict) {
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  out += std::string(dict);
  return out;
}

TEST(NpyTest, AnyKeyOrderAndSpacingIsAccepted) {
  auto header = ParseNpyHeader(WithDict(
      "{ \"shape\" : ( 4 , 2 ) ,'fortran_order':False,'descr':'=i2'}\n"));
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->dtype, DType::kInt16);
  EXPECT_FALSE(header->byte_swapped);
  EXPECT_THAT(header->shape, ElementsAre(4, 2));
  header = ParseNpyHeader(
      WithDict("{'descr': '|b1', 'fortran_order': True, 'shape': (7,)}"));
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->dtype, DType::kBool);
  header = ParseNpyHeader(
      WithDict("{'descr': '>u2', 'fortran_order': False, 'shape': (7,)}"));
  ASSERT_THAT(header, IsOk());
  EXPECT_TRUE(header->byte_swapped);
  EXPECT_EQ(header->dtype, DType::kUInt16);
}

TEST(NpyTest, UnsupportedDescrsAreNamed) {
  for (const char* descr : {"<c8", "|O", "<u3", "<f16", "|S5", "<M8", "<i3"}) {
    EXPECT_THAT(ParseNpyHeader(WithDict(absl::StrCat(
                    "{'descr': '", descr,
                    "', 'fortran_order': False, 'shape': (2,), }"))),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("'", descr, "'"))))
        << descr;
  }
  EXPECT_THAT(
      ParseNpyHeader(WithDict("{'descr': [('a', '<f4')], "
                              "'fortran_order': False, 'shape': (2,), "
                              "}")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("structured")));
}

TEST(NpyTest, ZeroDimArraysAreRejected) {
  EXPECT_THAT(ParseNpyHeader(Bytes(kZeroDimHex)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("0-d arrays are not supported")));
}

TEST(NpyTest, GarbageAndTruncatedInputsAreErrors) {
  EXPECT_THAT(ParseNpyHeader(""), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("not a .npy file")));
  EXPECT_THAT(ParseNpyHeader("PK\x03\x04 zip file"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a .npy file")));
  const std::string good = Bytes(kCFloat32Hex);
  for (size_t n = 6; n < 128; ++n) {
    EXPECT_THAT(
        ParseNpyHeader(good.substr(0, n)),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")))
        << n;
  }
  std::string bad_version = good;
  bad_version[6] = 9;
  EXPECT_THAT(
      ParseNpyHeader(bad_version),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version 9.0")));
  for (const char* dict :
       {"", "{", "}", "{'descr': '<f4'}",
        "{'descr': '<f4', 'fortran_order': "
        "Maybe, 'shape': (2,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} trailing",
        "{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': "
        "(99999999999999999999,)}"}) {
    EXPECT_THAT(ParseNpyHeader(WithDict(dict)),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << dict;
  }
  EXPECT_THAT(
      ParseNpyHeader(WithDict("{'descr': '<f8', 'fortran_order': False, "
                              "'shape': (4294967296, 4294967296)}")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  EXPECT_THAT(
      ParseNpyHeader(WithDict("{'descr': '<f8', 'fortran_order': False, "
                              "'shape': (1125899906842624, 2)}")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST(NpyTest, ShortDataIsReportedNotRead) {
  auto header = ParseNpyHeader(Bytes(kCFloat32Hex));
  ASSERT_THAT(header, IsOk());
  std::vector<char> data(23);
  EXPECT_THAT(
      NormalizeNpyData(*header, absl::MakeSpan(data)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
}

TEST(NpyTest, DataBytesAreCheckedAgainstTheFileSize) {
  const std::string file = Bytes(kCFloat32Hex);  // 2x3 float32, 24 data bytes
  auto header = ParseNpyHeader(file);
  ASSERT_THAT(header, IsOk());
  const int64_t end = static_cast<int64_t>(header->data_offset) + 24;
  EXPECT_THAT(NpyDataBytesInFile(*header, end), IsOkAndHolds(24));
  EXPECT_THAT(
      NpyDataBytesInFile(*header, end - 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  EXPECT_THAT(
      NpyDataBytesInFile(*header, 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  EXPECT_THAT(NpyDataBytesInFile(*header, end + 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("longer than its header says")));
}

TEST(NpyTest, AHeaderDeclaringTwoToThe47ElementsInA118ByteFileIsTruncated) {
  const std::string file = HugeHeaderNpyFile();
  ASSERT_EQ(file.size(), 118u);
  auto header = ParseNpyHeader(file);
  ASSERT_THAT(header, IsOk());  // a legal header: 2^49 bytes is under the cap
  EXPECT_THAT(NpyDataBytesInFile(*header, 118),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("truncated"),
                                        HasSubstr("562949953421312"),
                                        HasSubstr("only 0 follow"))));
}

TEST(NpyTest, RandomBytesNeverCrashTheParser) {
  uint64_t state = 12345;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string input =
        WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    // Corrupt a few bytes and truncate at random.
    for (int k = 0; k < 3; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      input[(state >> 33) % input.size()] = static_cast<char>(state >> 56);
    }
    input.resize((state >> 20) % (input.size() + 1));
    (void)ParseNpyHeader(input);
  }
}

}  // namespace
}  // namespace tessera
