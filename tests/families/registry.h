// The test tree's families (tests/families/<name>/), registered explicitly: the test binaries' main()
// (test_main.cpp, cli_main.cpp) calls this before anything reads the registry — no static initialiser whose
// order across files is unspecified.
#pragma once

namespace gclab::testing {

// Registers each test family, a line each (registry.cpp); once per process.
void register_test_families();

}  // namespace gclab::testing
