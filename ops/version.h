// The release version of the binaries and the version of the wire protocol
// they speak (the proto package every service and message lives in).
#ifndef TESSERA_OPS_VERSION_H_
#define TESSERA_OPS_VERSION_H_

#include <string>

namespace tessera {

inline constexpr char kVersion[] = "0.2.0";
inline constexpr char kWireProtocol[] = "tessera.v1";

// "PROGRAM 0.2.0 (wire protocol tessera.v1)".
std::string VersionLine(const std::string& program);
// Prints VersionLine to stdout.
void PrintVersion(const std::string& program);

}  // namespace tessera

#endif  // TESSERA_OPS_VERSION_H_
