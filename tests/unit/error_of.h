#pragma once
// The message of the qparity::Error that `f` throws; fails the test when it throws nothing.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.h"

namespace qparity::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qparity::Error";
  return "";
}

}  // namespace qparity::test
