// safetensors files through mappings (the format itself is core/
// safetensors.h). SafetensorsReader maps a file read-only, validated by
// ParseSafetensors, and hands out pointers into the mapping (no copy of the
// data); a file that shrinks meanwhile is caught (client/mapped_file.h).
// SafetensorsWriter maps a temporary file of a layout's final size next to
// the destination, lets the caller fill each entry in place, and renames
// it into place on Commit(); without Commit() nothing is left. Errors of
// open/mmap name the file.
//
// A Reader is immutable after Open and may be read from any thread; a
// Writer's entries may be filled from several threads (disjoint ranges),
// but Commit() is called once, by one.
#ifndef TESSERA_CLIENT_SAFETENSORS_FILE_H_
#define TESSERA_CLIENT_SAFETENSORS_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/mapped_file.h"
#include "core/safetensors.h"

namespace tessera {

// A safetensors file mapped read-only, validated by ParseSafetensors.
class SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(
      const std::string& path);
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsEntry>& entries() const {
    return header_.entries;
  }
  // The bytes of `entry` (one of entries()) inside the mapping.
  const char* data(const SafetensorsEntry& entry) const {
    return file_->data() + header_.data_offset + entry.begin;
  }

 private:
  SafetensorsReader() = default;
  std::string path_;
  std::unique_ptr<MappedInputFile> file_;
  SafetensorsHeader header_;
};

// Writes a laid-out file through a shared mapping of a temporary file in
// the destination's directory (same file system, so the rename is atomic).
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, SafetensorsLayout layout);
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::vector<SafetensorsEntry>& entries() const {
    return layout_.entries;
  }
  // Where entries()[i]'s bytes go.
  char* data(size_t i) {
    return file_->data() + layout_.header.size() + layout_.entries[i].begin;
  }
  int64_t file_bytes() const { return layout_.file_bytes; }

  // Unmaps, closes and renames the file to its destination. Without it,
  // destroying the writer removes the temporary file.
  absl::Status Commit() { return file_->Commit(); }

 private:
  SafetensorsWriter() = default;
  std::unique_ptr<MappedOutputFile> file_;
  SafetensorsLayout layout_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_SAFETENSORS_FILE_H_
