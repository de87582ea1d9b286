#include "client/safetensors_file.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"

namespace tessera {

// ---- SafetensorsReader and SafetensorsWriter -------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader());
  reader->path_ = path;
  TESSERA_ASSIGN_OR_RETURN(reader->file_,
                           MappedInputFile::Open(path, "safetensors file"));
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensors(reader->file_->bytes());
  // A header read while the file shrank (zeros past its new end) is no
  // header: say so rather than what the zeros look like.
  TESSERA_RETURN_IF_ERROR(reader->file_->CheckUnchanged());
  if (!header.ok()) {
    return Annotate(header.status(), absl::StrCat("reading '", path, "'"));
  }
  reader->header_ = *std::move(header);
  return reader;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, SafetensorsLayout layout) {
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  TESSERA_ASSIGN_OR_RETURN(
      writer->file_,
      MappedOutputFile::Create(path, layout.file_bytes, "safetensors file"));
  writer->layout_ = std::move(layout);
  std::memcpy(writer->file_->data(), writer->layout_.header.data(),
              writer->layout_.header.size());
  return writer;
}

}  // namespace tessera
