#include "rpc/testing/certificates.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "rpc/openssl_ptr.h"

namespace tessera {
namespace {

struct FileClose {
  void operator()(FILE* f) const { fclose(f); }
};

std::unique_ptr<FILE, FileClose> Open(const std::string& path) {
  return std::unique_ptr<FILE, FileClose>(fopen(path.c_str(), "r"));
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext =
      X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool added = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return added;
}

}  // namespace

absl::Status MakeTestCertificates(const std::string& dir, int workers) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string script =
      srcdir != nullptr ? absl::StrCat(srcdir, "/tessera/deploy/make-certs.sh")
                        : "deploy/make-certs.sh";
  const std::string command =
      absl::StrCat("/bin/bash ", script, " ", dir, " --workers ", workers,
                   " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("cannot run ", command));
  }
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) {
    output.append(buffer, n);
  }
  if (pclose(pipe) != 0) {
    return absl::InternalError(
        absl::StrCat(command, " failed:\n", output));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> IssueCertificate(
    const CertificateRequest& request) {
  auto ca_file = Open(request.ca_cert);
  auto ca_key_file = Open(request.ca_key);
  auto key_file = Open(request.key);
  if (ca_file == nullptr || ca_key_file == nullptr || key_file == nullptr) {
    return absl::NotFoundError("cannot read the CA, its key or the key");
  }
  X509Ptr ca(PEM_read_X509(ca_file.get(), nullptr, nullptr, nullptr));
  EvpKeyPtr ca_key(
      PEM_read_PrivateKey(ca_key_file.get(), nullptr, nullptr, nullptr));
  EvpKeyPtr key(PEM_read_PrivateKey(key_file.get(), nullptr, nullptr, nullptr));
  if (ca == nullptr || ca_key == nullptr || key == nullptr) {
    return absl::InvalidArgumentError("not PEM: the CA, its key or the key");
  }
  X509Ptr cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* number = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(number, X509_get_serialNumber(cert.get()));
  BN_free(number);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.get()));
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(
      subject, "CN", MBSTRING_ASC,
      reinterpret_cast<const unsigned char*>(request.name.c_str()), -1, -1, 0);
  ASN1_TIME_set(X509_getm_notBefore(cert.get()),
                absl::ToTimeT(request.not_before));
  ASN1_TIME_set(X509_getm_notAfter(cert.get()),
                absl::ToTimeT(request.not_after));
  X509_set_pubkey(cert.get(), key.get());
  const bool extended =
      AddExtension(cert.get(), ca.get(), NID_basic_constraints,
                   "critical,CA:FALSE") &&
      AddExtension(cert.get(), ca.get(), NID_key_usage,
                   "critical,digitalSignature") &&
      AddExtension(cert.get(), ca.get(), NID_ext_key_usage,
                   "serverAuth,clientAuth") &&
      AddExtension(
          cert.get(), ca.get(), NID_subject_alt_name,
          absl::StrCat("DNS:", request.name, ",DNS:localhost,IP:127.0.0.1")) &&
      AddExtension(cert.get(), ca.get(), NID_authority_key_identifier,
                   "keyid:always");
  if (!extended || X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("cannot make the certificate");
  }
  BioPtr out(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(out.get(), cert.get());
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::Status ReplaceFile(const std::string& path, const std::string& contents,
                         int mode) {
  const std::string temp = path + ".new";
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      static_cast<mode_t>(mode));
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temp));
  fchmod(fd, static_cast<mode_t>(mode));
  const bool written = write(fd, contents.data(), contents.size()) ==
                       static_cast<ssize_t>(contents.size());
  close(fd);
  if (!written || rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot replace ", path));
  }
  return absl::OkStatus();
}

}  // namespace tessera
