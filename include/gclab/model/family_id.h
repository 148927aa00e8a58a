// A model family's id: the name its folder registers under in the model registry (model/registry.h) —
// "flux" for src/model/families/flux/. No list of families exists outside the registry: a new family (or a
// test's) brings its own id.
#pragma once

#include <string>
#include <utility>

namespace gclab::model {

class Family {
 public:
  Family() = default;
  explicit Family(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  bool operator==(const Family& o) const { return name_ == o.name_; }
  bool operator!=(const Family& o) const { return name_ != o.name_; }
  bool operator<(const Family& o) const { return name_ < o.name_; }

 private:
  std::string name_;
};

}  // namespace gclab::model
