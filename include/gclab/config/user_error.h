// The one error type for "the user asked for something gclab cannot do": a bad config value, a missing
// folder, a bad command-line value. The CLI maps it to exit code 2 in one place; its message names the
// field or file and what to do.
#pragma once

#include <stdexcept>

namespace gclab {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace gclab
