// Test certificates: the set deploy/make-certs.sh makes, and ones with
// chosen validity signed by its CA: what a test needs to let a daemon's
// certificate expire while it runs, or to renew it. Test-only.
#ifndef TESSERA_RPC_TESTING_CERTIFICATES_H_
#define TESSERA_RPC_TESTING_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

// Runs deploy/make-certs.sh (from the test's runfiles; the test needs it
// as data) into `dir`: a CA, certificates it signed for the coordinator,
// workers w0 .. w<workers - 1> and a user, and their tokens. INTERNAL, with
// the script's output, when it fails.
absl::Status MakeTestCertificates(const std::string& dir, int workers);

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
