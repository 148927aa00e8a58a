// The gclab command line (src/cli/cli.cpp): every verb — check, train, estimate, bench, fit, advise, synth,
// ... — parsed from argv and run. The gclab executable's main() is this call; a binary that registers more
// families first (model::register_family: the test tree's) runs the same verbs on them.
#pragma once

namespace gclab::cli {

// Returns the process's exit code (0 ok, 1 a user error reported, ...).
int run(int argc, char** argv);

}  // namespace gclab::cli
