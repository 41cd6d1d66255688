// SHA-256 over bytes fed in pieces (OpenSSL's EVP), for the LFS hashes the Hub lists.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace m3::hub {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, std::size_t size);
  // The digest as 64 lowercase hex digits; the hasher is spent afterwards.
  std::string hex_digest();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

}  // namespace m3::hub
