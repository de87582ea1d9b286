#include "client/npy_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/npy.h"
#include "core/testing/npy_samples.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::HugeHeaderNpyFile;
using ::tessera::testing::IsOk;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempPath;
using ::tessera::testing::WriteStringToFile;
using ::testing::HasSubstr;

HostArray Iota(DType dtype, Shape shape) {
  HostArray a = HostArray::Allocate(dtype, std::move(shape));
  for (int64_t i = 0; i < a.num_bytes; ++i)
    a.data()[i] = static_cast<char>(i * 7 + 3);
  if (dtype == DType::kBool) {
    for (int64_t i = 0; i < a.num_bytes; ++i) a.data()[i] = i % 3 == 0;
  }
  return a;
}

TEST(NpyFileTest, RoundTripEveryDType) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    HostArray a = Iota(dtype, {3, 5, 2});
    const std::string path =
        TempPath(absl::StrCat("rt_", DTypeName(dtype), ".npy"));
    ASSERT_THAT(WriteNpyFile(path, a), IsOk());
    std::optional<DType> as;
    if (NpyFileDType(dtype) != dtype) as = dtype;  // raw words: asked for
    absl::StatusOr<HostArray> b = ReadNpyFile(path, as);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(b->dtype, dtype);
    EXPECT_EQ(b->shape, a.shape);
    ASSERT_EQ(b->num_bytes, a.num_bytes);
    EXPECT_EQ(std::memcmp(a.data(), b->data(), a.num_bytes), 0);
  }
}

TEST(NpyFileTest, WritesTheHeaderCoreEncodes) {
  HostArray a = Iota(DType::kInt16, {4});
  const std::string path = TempPath("header.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  const std::string bytes = ReadFileToString(path);
  const std::string header = EncodeNpyHeader(DType::kInt16, {4});
  EXPECT_EQ(bytes.substr(0, header.size()), header);
  EXPECT_EQ(bytes.size(), header.size() + 8);
  EXPECT_EQ(header.size() % 64, 0u);
}

TEST(NpyFileTest, EmptyArrayRoundTrips) {
  HostArray a = HostArray::Allocate(DType::kFloat32, {0, 3});
  const std::string path = TempPath("empty.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  absl::StatusOr<HostArray> b = ReadNpyFile(path, std::nullopt);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->shape, (Shape{0, 3}));
  EXPECT_EQ(b->num_bytes, 0);
}

// NumPy has no bfloat16 or float8: their files hold raw words ('<u2',
// '|u1'), read as uint16 / uint8 unless the dtype is asked for.
TEST(NpyFileTest, RawWordsAreTheirFileDTypeUnlessAskedFor) {
  for (DType dtype :
       {DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    SCOPED_TRACE(DTypeName(dtype));
    HostArray a = Iota(dtype, {2, 2});
    const std::string path = TempPath("words.npy");
    ASSERT_THAT(WriteNpyFile(path, a), IsOk());
    absl::StatusOr<HostArray> plain = ReadNpyFile(path, std::nullopt);
    ASSERT_THAT(plain, IsOk());
    EXPECT_EQ(plain->dtype, NpyFileDType(dtype));
    absl::StatusOr<HostArray> asked = ReadNpyFile(path, dtype);
    ASSERT_THAT(asked, IsOk());
    EXPECT_EQ(asked->dtype, dtype);
    EXPECT_EQ(std::memcmp(asked->data(), a.data(), a.num_bytes), 0);
    EXPECT_THAT(
        ReadNpyFile(path, DType::kInt16),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16")));
  }
}

TEST(NpyFileTest, ADifferentDTypeIsRefusedNamingBoth) {
  HostArray a = Iota(DType::kFloat32, {2});
  const std::string path = TempPath("f32.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  EXPECT_THAT(ReadNpyFile(path, DType::kFloat32), IsOk());
  EXPECT_THAT(
      ReadNpyFile(path, DType::kFloat64),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("float32"), HasSubstr("float64"),
                                HasSubstr(path))));
}

TEST(NpyFileTest, TruncatedAndTooLongFilesAreRefused) {
  HostArray a = Iota(DType::kInt32, {10});
  const std::string path = TempPath("trunc.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  const std::string bytes = ReadFileToString(path);
  WriteStringToFile(path, bytes.substr(0, bytes.size() - 1));
  EXPECT_THAT(
      ReadNpyFile(path, std::nullopt),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("truncated"), HasSubstr(path))));
  WriteStringToFile(path, bytes + "x");
  EXPECT_THAT(ReadNpyFile(path, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("longer"), HasSubstr(path))));
  WriteStringToFile(path, bytes.substr(0, 20));
  EXPECT_THAT(ReadNpyFile(path, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  WriteStringToFile(path, "hello world, not numpy");
  EXPECT_THAT(
      ReadNpyFile(path, std::nullopt),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a .npy")));
}

TEST(NpyFileTest, HeaderPromisingMoreThanTheFileIsRefusedBeforeAllocating) {
  const std::string file = HugeHeaderNpyFile();
  ASSERT_EQ(file.size(), 118u);
  const std::string path = TempPath("huge_header.npy");
  WriteStringToFile(path, file);
  // Allocating first would throw std::bad_alloc (2^49 bytes): the file's
  // size is checked before.
  EXPECT_THAT(ReadNpyFile(path, std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("truncated"),
                                        HasSubstr("140737488355328"),
                                        HasSubstr(path))));
}

TEST(NpyFileTest, HugeHeaderThroughAPipeAllocatesOnlyWhatArrives) {
  const std::string path = TempPath("huge_header.fifo");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&] {
    std::ofstream out(path, std::ios::binary);
    out << HugeHeaderNpyFile() << std::string(1000, 'x');
  });
  absl::StatusOr<HostArray> read = ReadNpyFile(path, std::nullopt);
  writer.join();
  unlink(path.c_str());
  EXPECT_THAT(read.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                      ::testing::AllOf(HasSubstr("truncated"),
                                                       HasSubstr("1000 follow"),
                                                       HasSubstr(path))));
}

TEST(NpyFileTest, APipeDeliveringTheWholeArrayIsRead) {
  HostArray a = Iota(DType::kInt32, {3, 4});
  const std::string file_path = TempPath("pipe_source.npy");
  ASSERT_THAT(WriteNpyFile(file_path, a), IsOk());
  const std::string bytes = ReadFileToString(file_path);
  const std::string path = TempPath("whole.fifo");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&] {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  });
  absl::StatusOr<HostArray> b = ReadNpyFile(path, std::nullopt);
  writer.join();
  unlink(path.c_str());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->shape, a.shape);
  ASSERT_EQ(b->num_bytes, a.num_bytes);
  EXPECT_EQ(std::memcmp(a.data(), b->data(), a.num_bytes), 0);
}

TEST(NpyFileTest, MissingFileIsNamed) {
  const std::string path = TempPath("does_not_exist.npy");
  EXPECT_THAT(ReadNpyFile(path, std::nullopt),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(
      ReadNpyFile(TempPath(""), std::nullopt),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
}

TEST(NpyFileTest, WriteIntoAMissingDirectoryFailsNamingThePath) {
  HostArray a = Iota(DType::kInt8, {3});
  const std::string path = TempPath("no/such/dir/out.npy");
  EXPECT_THAT(WriteNpyFile(path, a),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(NpyFileTest, ReadsBigEndianFortranOrder) {
  // A 2x3 '>i4' Fortran-order array holding [[0,1,2],[3,4,5]].
  std::string dict =
      "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }";
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  const int fortran[6] = {0, 3, 1, 4, 2, 5};
  for (int v : fortran) {
    bytes += std::string("\0\0\0", 3);
    bytes += static_cast<char>(v);
  }
  const std::string path = TempPath("be_f.npy");
  WriteStringToFile(path, bytes);
  absl::StatusOr<HostArray> a = ReadNpyFile(path, std::nullopt);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->dtype, DType::kInt32);
  EXPECT_EQ(a->shape, (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a->As<int32_t>()[i], i);
}

TEST(NpyFileTest, ReadsWhatNumPyWrites) {
  if (access("/usr/bin/python3", X_OK) != 0)
    GTEST_SKIP() << "no /usr/bin/python3";
  const std::string path = TempPath("numpy.npy");
  const std::string cmd = absl::StrCat(
      "/usr/bin/python3 -c 'import numpy as np; "
      "np.save(\"",
      path,
      "\", np.asfortranarray(np.arange(24, dtype=\">f8\").reshape(2, 3, 4)))' "
      "2>/dev/null");
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "numpy not available";
  absl::StatusOr<HostArray> a = ReadNpyFile(path, std::nullopt);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->dtype, DType::kFloat64);
  EXPECT_EQ(a->shape, (Shape{2, 3, 4}));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(a->As<double>()[i], i);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(OpenNpyFileTest, CFileIsMappedInPlace) {
  HostArray a = Iota(DType::kFloat32, {4, 6});
  const std::string path = TempPath("mapped.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  absl::StatusOr<NpyInput> in = OpenNpyFile(path, std::nullopt);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_TRUE(in->mapped);
  EXPECT_EQ(in->dtype, DType::kFloat32);
  EXPECT_EQ(in->shape, (Shape{4, 6}));
  ASSERT_EQ(in->num_bytes, a.num_bytes);
  EXPECT_EQ(std::memcmp(in->data(), a.data(), a.num_bytes), 0);
}

TEST(OpenNpyFileTest, BigEndianFortranIsConvertedInMemory) {
  std::string dict =
      "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 2), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(dict.size());
  bytes += '\0';
  bytes += dict;
  for (int v : {0, 2, 1, 3}) bytes += std::string{'\0', static_cast<char>(v)};
  const std::string path = TempPath("be_fortran_open.npy");
  WriteStringToFile(path, bytes);
  absl::StatusOr<NpyInput> in = OpenNpyFile(path, std::nullopt);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_FALSE(in->mapped);
  const int16_t* v = reinterpret_cast<const int16_t*>(in->data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v[i], i);
}

TEST(OpenNpyFileTest, SameChecksAsReadNpyFile) {
  HostArray a = Iota(DType::kBFloat16, {3});
  const std::string path = TempPath("bf16_open.npy");
  ASSERT_THAT(WriteNpyFile(path, a), IsOk());
  absl::StatusOr<NpyInput> in = OpenNpyFile(path, std::nullopt);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_EQ(in->dtype, DType::kUInt16);
  in = OpenNpyFile(path, DType::kBFloat16);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_EQ(in->dtype, DType::kBFloat16);
  in = OpenNpyFile(path, std::nullopt, /*words_of=*/DType::kBFloat16);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_EQ(in->dtype, DType::kBFloat16);
  // Words of another dtype's size keep the file's dtype.
  in = OpenNpyFile(path, std::nullopt, /*words_of=*/DType::kFloat8E5M2);
  ASSERT_THAT(in.status(), IsOk());
  EXPECT_EQ(in->dtype, DType::kUInt16);
  EXPECT_THAT(OpenNpyFile(path, DType::kInt16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int16")));
  // Truncated: refused, naming the file.
  const std::string whole = ReadFileToString(path);
  const std::string cut = TempPath("cut_open.npy");
  WriteStringToFile(cut, whole.substr(0, whole.size() - 1));
  EXPECT_THAT(
      OpenNpyFile(cut, DType::kBFloat16).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  EXPECT_THAT(
      OpenNpyFile(cut, std::nullopt, /*words_of=*/DType::kBFloat16).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  EXPECT_THAT(OpenNpyFile(TempPath("absent_open.npy"), std::nullopt).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(NpyFileWriterTest, WritesWhatReadNpyFileReads) {
  const std::string path = TempPath("writer.npy");
  absl::StatusOr<std::unique_ptr<NpyFileWriter>> w =
      NpyFileWriter::Create(path, DType::kInt16, {3, 5});
  ASSERT_THAT(w.status(), IsOk());
  ASSERT_EQ((*w)->data_bytes(), 30);
  for (int i = 0; i < 15; ++i) {
    reinterpret_cast<int16_t*>((*w)->data())[i] = static_cast<int16_t>(i - 7);
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);  // nothing before Commit
  ASSERT_THAT((*w)->Commit(), IsOk());
  absl::StatusOr<HostArray> back = ReadNpyFile(path, std::nullopt);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->shape, (Shape{3, 5}));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(back->As<int16_t>()[i], i - 7);
  // Byte for byte what WriteNpyFile writes.
  const std::string copy = TempPath("writer_copy.npy");
  ASSERT_THAT(WriteNpyFile(copy, *back), IsOk());
  EXPECT_EQ(ReadFileToString(copy), ReadFileToString(path));
}

TEST(NpyFileWriterTest, UncommittedLeavesNothingAndEmptyArraysWork) {
  const std::string dir = TempPath("npy_writer_dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  {
    absl::StatusOr<std::unique_ptr<NpyFileWriter>> w =
        NpyFileWriter::Create(dir + "/x.npy", DType::kFloat64, {1000});
    ASSERT_THAT(w.status(), IsOk());
  }
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "a temporary file was left behind";
  const std::string empty = TempPath("empty_writer.npy");
  absl::StatusOr<std::unique_ptr<NpyFileWriter>> w =
      NpyFileWriter::Create(empty, DType::kFloat32, {0, 3});
  ASSERT_THAT(w.status(), IsOk());
  EXPECT_EQ((*w)->data_bytes(), 0);
  ASSERT_THAT((*w)->Commit(), IsOk());
  absl::StatusOr<HostArray> back = ReadNpyFile(empty, std::nullopt);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->shape, (Shape{0, 3}));
  EXPECT_THAT(NpyFileWriter::Create(TempPath("no/dir/x.npy"), DType::kInt8, {1})
                  .status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/dir/x.npy")));
  EXPECT_THAT(NpyFileWriter::Create(TempPath("huge.npy"), DType::kInt64,
                                    {int64_t{1} << 40, int64_t{1} << 40})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tessera
