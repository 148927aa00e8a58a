// gclab with the test tree's families registered (gclab_test_families): the same verbs as the shipped
// binary, for the runs of the families' tests that go through the command line (the phase sweep).
#include "families/registry.h"
#include "gclab/cli/cli.h"

int main(int argc, char** argv) {
  gclab::testing::register_test_families();
  return gclab::cli::run(argc, argv);
}
