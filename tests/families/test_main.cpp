// The family tests' main: the test tree's families registered, then GoogleTest.
#include <gtest/gtest.h>

#include "families/registry.h"

int main(int argc, char** argv) {
  gclab::testing::register_test_families();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
