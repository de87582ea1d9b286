// Test certificates with chosen validity, signed by an existing CA (the one
// deploy/make-certs.sh made): what a test needs to let a daemon's
// certificate expire while it runs, or to renew it. Test-only.
#ifndef TESSERA_RPC_TESTING_CERTIFICATES_H_
#define TESSERA_RPC_TESTING_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

struct CertificateRequest {
  std::string ca_cert;  // PEM file of the CA certificate
  std::string ca_key;   // PEM file of its key
  std::string key;      // PEM file of the key to certify
  std::string name;     // CN, and DNS:name beside DNS:localhost, IP:127.0.0.1
  absl::Time not_before;
  absl::Time not_after;
};

// A PEM certificate as make-certs.sh makes a daemon's (extendedKeyUsage
// serverAuth and clientAuth), with the validity asked for.
absl::StatusOr<std::string> IssueCertificate(const CertificateRequest& request);

// Writes `contents` to `path` through a temporary file and a rename, as a
// rotation should (a reader sees the old file or the new one, never half).
absl::Status ReplaceFile(const std::string& path, const std::string& contents,
                         int mode = 0600);

}  // namespace tessera

#endif  // TESSERA_RPC_TESTING_CERTIFICATES_H_
