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
# The HTTP server: Boost.Beast and Boost.Asio (header-only, libboost-dev), TLS through OpenSSL
# (libssl-dev). Optional here so builds that never link the server (the GPU machine's) configure
# without them; server/CMakeLists.txt requires them.
find_package(Boost 1.74 QUIET)
find_package(OpenSSL QUIET)
if(M3_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(benchmark QUIET)
endif()
