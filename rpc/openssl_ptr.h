// Owning pointers to OpenSSL objects, each freed by its own OpenSSL call.
// Header only: a user links the OpenSSL library its objects come from
// (//third_party:openssl, or :openssl_ssl for SSL and SSL_CTX).
#ifndef TESSERA_RPC_OPENSSL_PTR_H_
#define TESSERA_RPC_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>

namespace tessera {

template <auto Free>
struct OpenSslFree {
  template <typename T>
  void operator()(T* object) const {
    Free(object);
  }
};

using BioPtr = std::unique_ptr<BIO, OpenSslFree<BIO_free>>;
using EvpKeyPtr = std::unique_ptr<EVP_PKEY, OpenSslFree<EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, OpenSslFree<X509_free>>;
using SslCtxPtr = std::unique_ptr<SSL_CTX, OpenSslFree<SSL_CTX_free>>;
using SslPtr = std::unique_ptr<SSL, OpenSslFree<SSL_free>>;

}  // namespace tessera

#endif  // TESSERA_RPC_OPENSSL_PTR_H_
