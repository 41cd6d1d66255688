# Every dependency is a Debian package (scripts/install-deps.sh); nothing is vendored.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Collectives of the CPU backend's parallel layouts (libgloo-dev).
find_package(Gloo REQUIRED)
# The HTTP server: Boost.Beast and Boost.Asio (header-only, libboost-dev), TLS through OpenSSL
# (libssl-dev). Required unless M3_BUILD_SERVER is OFF (the GPU machine's kernel-check builds).
if(M3_BUILD_SERVER)
  find_package(Boost 1.74 REQUIRED)
  find_package(OpenSSL REQUIRED)
endif()
if(M3_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(benchmark QUIET)
endif()
