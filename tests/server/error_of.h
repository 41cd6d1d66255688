// error_of(fn): runs `fn` and returns the ApiError it throws; the test fails when it does not
// throw. Shared by the request-parsing tests of every route.
#pragma once
#include <gtest/gtest.h>

#include "server/api_error.h"

namespace m3::server {

template <class Fn>
ApiError error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}

}  // namespace m3::server
