// The gclab executable: the command line (gclab/cli/cli.h) over the shipped families.
#include "gclab/cli/cli.h"

int main(int argc, char** argv) { return gclab::cli::run(argc, argv); }
