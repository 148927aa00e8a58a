// Reading and writing .safetensors files (https://github.com/huggingface/safetensors, "Format"):
//   8 bytes   N, little-endian u64: the length of the header
//   N bytes   a JSON object: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "value", ...}}  (optionally padded with spaces)
//   the rest  the byte buffer; offsets are relative to its start, tensors are little-endian, row-major.
//
// The reader validates everything before any tensor is touched, as the reference implementation does:
// the header length fits the file, the header is a JSON object of well-formed entries, every dtype is
// known, each entry's byte range equals its shape's element count times the dtype size (no overflow),
// ranges lie inside the buffer, do not overlap and cover it without holes. A corrupt or truncated file
// is a SafetensorsError naming the file and the entry — never a crash or an out-of-bounds read.
//
// Files are memory-mapped (copy-on-write), so a 24 GB checkpoint is read once, by the tensor that needs
// it; tensors returned by `tensor()` view the mapping when aligned and keep it alive.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gclab::io {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorEntry {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer
  uint64_t end = 0;
};

// "F32" <-> c10::ScalarType::Float, ...; throws SafetensorsError for a dtype gclab does not handle.
c10::ScalarType dtype_from_safetensors(const std::string& name);
std::string dtype_to_safetensors(c10::ScalarType dtype);

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws SafetensorsError.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Validates an in-memory file (tests, fuzzing); the bytes are copied.
  static SafetensorsFile from_bytes(std::string bytes, std::string label = "<memory>");

  const std::vector<TensorEntry>& entries() const { return entries_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorEntry& entry(const std::string& name) const;  // throws SafetensorsError naming the file
  // A CPU tensor with the entry's dtype and shape (viewing the mapping when aligned, else a copy).
  torch::Tensor tensor(const std::string& name) const;
  // Every tensor, by name.
  std::map<std::string, torch::Tensor> tensors() const;
  const std::string& label() const { return label_; }

  struct Buffer;  // the mapped or owned bytes (defined in the .cpp)

 private:
  SafetensorsFile() = default;
  void parse();

  std::shared_ptr<Buffer> buffer_;
  std::string label_;
  uint64_t data_start_ = 0;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; copied to CPU, contiguous) in the given order with the given metadata.
// The file is written under a temporary name next to `path` and renamed over it only when complete, so
// a crash or a full disk never leaves a half-written file under the real name. Throws SafetensorsError.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The bytes save_safetensors would write (tests, and writers that stream elsewhere).
std::string serialize_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// Writes a model's weights the way diffusers' save_pretrained does: `<stem>.safetensors` when they fit one
// shard of at most max_shard_bytes (diffusers: 5 GB), else `<stem>-0000N-of-0000M.safetensors` shards
// (tensors in order, a new shard when the next would overflow) with `<stem>.safetensors.index.json`
// ({"metadata": {"total_size"}, "weight_map"}). Returns the files written. Throws SafetensorsError.
std::vector<std::filesystem::path> save_sharded_safetensors(
    const std::filesystem::path& dir, const std::string& stem,
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t max_shard_bytes = 5'000'000'000);

// Loads every tensor of one file, or of a sharded checkpoint given its `*.safetensors.index.json`
// (diffusers / transformers `weight_map`), copying nothing twice. Throws SafetensorsError.
std::map<std::string, torch::Tensor> load_safetensors(const std::filesystem::path& path);

// Hands a file's named tensors to the parameters that ask for them by name and shape, and keeps the account:
// take() returns the tensor (nullptr when it is missing or misshapen, which is recorded); finish() throws
// std::runtime_error naming the file and the first problem (and how many more), else returns the names
// nothing took.
class TensorMatcher {
 public:
  TensorMatcher(std::map<std::string, torch::Tensor> tensors, std::string label);
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  const torch::Tensor* take(const std::string& name, c10::IntArrayRef sizes);
  std::vector<std::string> finish() const;

 private:
  std::map<std::string, torch::Tensor> tensors_;
  std::string label_;
  std::set<std::string> used_;
  std::vector<std::string> problems_;
};

// The weight files a transformers model folder holds: model.safetensors, or its sharded index.
const std::vector<std::string>& transformers_weight_files();
// The weights `path` names: itself when it is a file, else the first of `folder_files` in that folder;
// empty when there is none.
std::filesystem::path find_weights(const std::filesystem::path& path, const std::vector<std::string>& folder_files);

// Loads every parameter of `module` by its name (and each buffer the file holds), shapes checked, from `path`:
// a .safetensors file, a sharded *.index.json, or a folder holding the first of `folder_files` that exists there
// (diffusers: diffusion_pytorch_model.safetensors[.index.json]; transformers: model.safetensors[.index.json]).
// `stored_as` gives other names a parameter may be stored under (tied weights, a prefix one version of the
// writer dropped), tried when its own name is absent. A 1 x 1 convolution's kernel stands for a Linear's
// weight of its first two sizes (BFL's autoencoder attention). Throws std::runtime_error naming the first missing
// or misshapen tensor; returns the names in the file the module does not use.
std::vector<std::string> load_module_weights(
    torch::nn::Module& module, const std::filesystem::path& path, const std::vector<std::string>& folder_files,
    const std::function<std::vector<std::string>(const std::string&)>& stored_as = {});

}  // namespace gclab::io
