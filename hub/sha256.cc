#include "hub/sha256.h"

#include <openssl/evp.h>

#include "core/error.h"

namespace m3::hub {

struct Sha256::Context {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  ~Context() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  M3_CHECK(context_->md != nullptr && EVP_DigestInit_ex(context_->md, EVP_sha256(), nullptr) == 1,
           "SHA-256: OpenSSL could not start a digest");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, std::size_t size) {
  M3_CHECK(EVP_DigestUpdate(context_->md, data, size) == 1, "SHA-256: OpenSSL digest update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  M3_CHECK(EVP_DigestFinal_ex(context_->md, digest, &length) == 1, "SHA-256: OpenSSL digest failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

}  // namespace m3::hub
