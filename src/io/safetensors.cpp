#include "gclab/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace gclab::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian bytes");

namespace {

// The reference implementation refuses headers over 100 MB (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// JSON nesting a valid header never exceeds (object → entry → shape array); deeper input is refused
// before the recursive parser sees it.
constexpr int kMaxJsonDepth = 8;

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"U16", c10::ScalarType::UInt16},
    {"I32", c10::ScalarType::Int},
    {"U32", c10::ScalarType::UInt32},
    {"I64", c10::ScalarType::Long},
    {"U64", c10::ScalarType::UInt64},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
};

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw SafetensorsError(label + ": " + what);
}

int json_depth(const char* p, size_t n) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

}  // namespace

c10::ScalarType dtype_from_safetensors(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw SafetensorsError("unsupported safetensors dtype \"" + name + "\"");
}

std::string dtype_to_safetensors(c10::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype) return d.name;
  throw SafetensorsError(std::string("dtype ") + c10::toString(dtype) + " cannot be stored in safetensors");
}

// The file's bytes: a private (copy-on-write) mapping, or an owned string for in-memory files.
struct SafetensorsFile::Buffer {
  const char* data = nullptr;
  uint64_t size = 0;
  void* mapping = nullptr;
  std::string owned;

  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (mapping != nullptr) munmap(mapping, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.label_ = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(file.label_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(file.label_, "not a regular file");
  }
  auto buffer = std::make_shared<Buffer>();
  buffer->size = static_cast<uint64_t>(st.st_size);
  if (buffer->size >= 8) {
    // PROT_WRITE on a private mapping: a tensor viewing it may be modified in place without touching the
    // file (copy-on-write) instead of faulting.
    void* m = mmap(nullptr, buffer->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(file.label_, std::string("cannot map: ") + std::strerror(err));
    }
    buffer->mapping = m;
    buffer->data = static_cast<const char*>(m);
  }
  ::close(fd);
  file.buffer_ = std::move(buffer);
  file.parse();
  return file;
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, std::string label) {
  SafetensorsFile file;
  file.label_ = std::move(label);
  auto buffer = std::make_shared<Buffer>();
  buffer->owned = std::move(bytes);
  buffer->data = buffer->owned.data();
  buffer->size = buffer->owned.size();
  file.buffer_ = std::move(buffer);
  file.parse();
  return file;
}

void SafetensorsFile::parse() {
  const uint64_t size = buffer_->size;
  if (size < 8) fail(label_, "truncated: " + std::to_string(size) + " bytes, less than the 8-byte header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, buffer_->data, 8);
  if (header_bytes > kMaxHeaderBytes)
    fail(label_, "header length " + std::to_string(header_bytes) + " exceeds the 100 MB limit (corrupt file?)");
  if (header_bytes > size - 8)
    fail(label_, "truncated: header length " + std::to_string(header_bytes) + " but only " + std::to_string(size - 8) +
                     " bytes follow");
  const char* header = buffer_->data + 8;
  if (json_depth(header, header_bytes) > kMaxJsonDepth) fail(label_, "header nests too deeply to be safetensors");
  const nlohmann::json json = nlohmann::json::parse(header, header + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) fail(label_, "header is not valid JSON");
  if (!json.is_object()) fail(label_, "header is not a JSON object");

  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = size - data_start_;
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(label_, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail(label_, "__metadata__." + k + " is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\": ";
    if (!value.is_object()) fail(label_, where + "entry is not an object");
    const auto dtype = value.find("dtype");
    const auto shape = value.find("shape");
    const auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) fail(label_, where + "missing or non-string dtype");
    if (shape == value.end() || !shape->is_array()) fail(label_, where + "missing or non-array shape");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned())
      fail(label_, where + "data_offsets must be two non-negative integers");
    TensorEntry e;
    e.name = name;
    try {
      e.dtype = dtype_from_safetensors(dtype->get<std::string>());
    } catch (const SafetensorsError& err) {
      fail(label_, where + err.what());
    }
    uint64_t elements = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) fail(label_, where + "shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, dim, &elements))
        fail(label_, where + "shape overflows");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    uint64_t expected = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(c10::elementSize(e.dtype)), &expected))
      fail(label_, where + "byte size overflows");
    if (e.end < e.begin) fail(label_, where + "data_offsets end before they begin");
    if (e.end > data_bytes)
      fail(label_, where + "bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") lie outside the " +
                       std::to_string(data_bytes) + "-byte data buffer (truncated file?)");
    if (e.end - e.begin != expected)
      fail(label_, where + "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but " +
                       dtype->get<std::string>() + " " + shape->dump() + " needs " + std::to_string(expected));
    index_[e.name] = entries_.size();
    entries_.push_back(std::move(e));
  }
  // Ranges must tile the buffer: sorted by offset, each starts where the previous ended (no overlap, no
  // hole), and the last ends at the end of the file.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& e : entries_)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  uint64_t cursor = 0;
  for (const TensorEntry* e : by_offset) {
    if (e->begin < cursor) fail(label_, "tensor \"" + e->name + "\" overlaps the tensor before it");
    if (e->begin > cursor) fail(label_, "unindexed bytes before tensor \"" + e->name + "\"");
    cursor = e->end;
  }
  if (cursor != data_bytes)
    fail(label_, std::to_string(data_bytes - cursor) + " bytes after the last tensor are not indexed");
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(label_, "has no tensor \"" + name + "\"");
  return entries_[it->second];
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorEntry& e = entry(name);
  const auto options = torch::TensorOptions().dtype(e.dtype).device(torch::kCPU);
  const uint64_t bytes = e.end - e.begin;
  if (bytes == 0) return torch::empty(e.shape, options);
  const char* src = buffer_->data + data_start_ + e.begin;
  if (reinterpret_cast<uintptr_t>(src) % c10::elementSize(e.dtype) == 0) {
    auto keep = buffer_;  // the tensor keeps the mapping alive
    return torch::from_blob(
        const_cast<char*>(src), e.shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  torch::Tensor out = torch::empty(e.shape, options);
  std::memcpy(out.data_ptr(), src, bytes);
  return out;
}

std::map<std::string, torch::Tensor> SafetensorsFile::tensors() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : entries_) out.emplace(e.name, tensor(e.name));
  return out;
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> cpu;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw SafetensorsError("\"__metadata__\" cannot name a tensor");
    if (!names.insert(name).second) throw SafetensorsError("tensor name \"" + name + "\" given twice");
    if (!t.defined()) throw SafetensorsError("tensor \"" + name + "\" is undefined");
    dtype_to_safetensors(t.scalar_type());  // throws for a dtype safetensors cannot hold
    cpu.push_back(t.detach().to(torch::kCPU).contiguous());
  }
  // The reference writer's layout (safetensors' `prepare`: by dtype, the later of its Dtype enum first, then
  // by name), which puts larger elements first so every tensor starts aligned to its element size (the
  // header is padded to 8 bytes); the same bytes as its files, which hashes of the data (a LoRA's sshs_*)
  // rely on.
  static const std::vector<std::string> kDtypeOrder = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                                       "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
  auto rank = [&](size_t i) {
    const std::string d = dtype_to_safetensors(cpu[i].scalar_type());
    return std::find(kDtypeOrder.begin(), kDtypeOrder.end(), d) - kDtypeOrder.begin();
  };
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto ra = rank(a), rb = rank(b);
    return ra != rb ? ra > rb : tensors[a].first < tensors[b].first;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> begin(tensors.size());
  uint64_t cursor = 0;
  for (size_t i : order) {
    begin[i] = cursor;
    cursor += static_cast<uint64_t>(cpu[i].nbytes());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    header[tensors[i].first] = {{"dtype", dtype_to_safetensors(cpu[i].scalar_type())},
                                {"shape", cpu[i].sizes().vec()},
                                {"data_offsets", {begin[i], begin[i] + static_cast<uint64_t>(cpu[i].nbytes())}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + cursor);
  const uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (size_t i : order) out.append(static_cast<const char*>(cpu[i].data_ptr()), cpu[i].nbytes());
  return out;
}

namespace {

// Fault injection for the tests that kill a run inside a save: GCLAB_FAULT_KILL_IN_SAVE=N sends this
// process SIGKILL halfway through the Nth file it writes (tests/cli/never_lose_work.cmake).
void maybe_killed_midway(int fd, const std::string& bytes) {
  static const char* const at = std::getenv("GCLAB_FAULT_KILL_IN_SAVE");
  static int written = 0;
  if (at == nullptr || ++written != std::atoi(at)) return;
  if (::write(fd, bytes.data(), bytes.size() / 2) < 0) {
  }
  ::raise(SIGKILL);
}

// Writes all of `bytes` to fd; false on an error (errno set).
bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string bytes = serialize_safetensors(tensors, metadata);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  // Written to a temporary name, flushed to the disk (fsync), then renamed over the old file and the folder
  // flushed: a crash at any point leaves either the previous file or the new one whole, never a part.
  const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SafetensorsError(tmp.string() + ": cannot create: " + std::strerror(errno));
  maybe_killed_midway(fd, bytes);
  const bool ok = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok) {
    std::filesystem::remove(tmp, ec);
    throw SafetensorsError(path.string() + ": write failed (" + std::strerror(error) +
                           "; disk full?); the previous file, if any, is untouched");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw SafetensorsError(path.string() + ": cannot rename the finished file into place: " + ec.message());
  }
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);  // the rename itself reaches the disk
    ::close(dir);
  }
}

std::map<std::string, torch::Tensor> load_safetensors(const std::filesystem::path& path) {
  const std::string p = path.string();
  const std::string suffix = ".index.json";
  if (p.size() < suffix.size() || p.compare(p.size() - suffix.size(), suffix.size(), suffix) != 0)
    return SafetensorsFile::open(path).tensors();
  // A sharded checkpoint: {"weight_map": {"tensor name": "shard file name", ...}} next to the shards.
  std::ifstream in(path);
  if (!in) throw SafetensorsError(p + ": cannot open");
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw SafetensorsError(p + ": not a safetensors index (no \"weight_map\" object)");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) throw SafetensorsError(p + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string file = shard.get<std::string>();
    if (file.find('/') != std::string::npos || file == "..")
      throw SafetensorsError(p + ": shard name \"" + file + "\" must be a file next to the index");
    by_shard[file].push_back(name);
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& [file, names] : by_shard) {
    const SafetensorsFile shard = SafetensorsFile::open(path.parent_path() / file);
    for (const auto& name : names) out.emplace(name, shard.tensor(name));
  }
  return out;
}

std::vector<std::filesystem::path> save_sharded_safetensors(
    const std::filesystem::path& dir, const std::string& stem,
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors, int64_t max_shard_bytes) {
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& item : tensors) {
    const int64_t bytes = static_cast<int64_t>(item.second.nbytes());
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(item);
    in_shard += bytes, total += bytes;
  }
  std::filesystem::create_directories(dir);
  std::vector<std::filesystem::path> written;
  if (shards.size() == 1) {
    written.push_back(dir / (stem + ".safetensors"));
    save_safetensors(written.back(), shards[0]);
    return written;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    written.push_back(dir / (stem + name));
    save_safetensors(written.back(), shards[i]);
    for (const auto& [tensor, t] : shards[i]) index["weight_map"][tensor] = written.back().filename().string();
  }
  const std::filesystem::path index_path = dir / (stem + ".safetensors.index.json");
  const std::filesystem::path tmp = index_path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << index.dump(2) << "\n";
    if (!out) throw SafetensorsError(index_path.string() + ": write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, index_path, ec);
  if (ec) throw SafetensorsError(index_path.string() + ": cannot rename the finished file into place: " + ec.message());
  written.push_back(index_path);
  return written;
}

TensorMatcher::TensorMatcher(std::map<std::string, torch::Tensor> tensors, std::string label)
    : tensors_(std::move(tensors)), label_(std::move(label)) {}

const torch::Tensor* TensorMatcher::take(const std::string& name, c10::IntArrayRef sizes) {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    problems_.push_back("missing " + name);
    return nullptr;
  }
  if (it->second.sizes() != sizes) {
    // A 1 x 1 convolution's kernel [out, in, 1, 1] for a Linear's [out, in] (BFL's attention projections where
    // diffusers has Linears: its conversions' conv_attn_to_linear), and no other difference.
    const auto have = it->second.sizes();
    const bool one_by_one = have.size() == sizes.size() + 2 && have.slice(0, sizes.size()) == sizes &&
                            have[have.size() - 1] == 1 && have[have.size() - 2] == 1;
    if (!one_by_one) {
      problems_.push_back(name + " has shape " + c10::str(it->second.sizes()) + ", the model needs " + c10::str(sizes));
      return nullptr;
    }
    it->second = it->second.view(sizes);
  }
  used_.insert(name);
  return &it->second;
}

std::vector<std::string> TensorMatcher::finish() const {
  if (!problems_.empty())
    throw std::runtime_error(
        label_ + ": " + problems_.front() +
        (problems_.size() > 1 ? " (and " + std::to_string(problems_.size() - 1) + " more missing or misshapen tensors)"
                              : std::string()));
  std::vector<std::string> unused;
  for (const auto& [name, t] : tensors_)
    if (!used_.count(name)) unused.push_back(name);
  return unused;
}

const std::vector<std::string>& transformers_weight_files() {
  static const std::vector<std::string> files{"model.safetensors", "model.safetensors.index.json"};
  return files;
}

std::filesystem::path find_weights(const std::filesystem::path& path, const std::vector<std::string>& folder_files) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec))
    return std::filesystem::exists(path, ec) ? path : std::filesystem::path();
  for (const auto& name : folder_files)
    if (std::filesystem::exists(path / name, ec)) return path / name;
  return {};
}

std::vector<std::string> load_module_weights(
    torch::nn::Module& module, const std::filesystem::path& path, const std::vector<std::string>& folder_files,
    const std::function<std::vector<std::string>(const std::string&)>& stored_as) {
  const std::filesystem::path file = find_weights(path, folder_files);
  if (file.empty())
    throw std::runtime_error(path.string() + ": holds no " + (folder_files.empty() ? "weights" : folder_files.front()));
  TensorMatcher tensors(load_safetensors(file), file.string());
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) {
    std::string name = p.key();
    if (!tensors.contains(name) && stored_as)
      for (const auto& other : stored_as(name))
        if (tensors.contains(other)) {
          name = other;
          break;
        }
    if (const torch::Tensor* t = tensors.take(name, p.value().sizes())) p.value().copy_(*t);
  }
  // Buffers the file holds (a BatchNorm's running statistics) load too; the others keep what the module made.
  for (auto& b : module.named_buffers())
    if (tensors.contains(b.key()))
      if (const torch::Tensor* t = tensors.take(b.key(), b.value().sizes())) b.value().copy_(*t);
  return tensors.finish();
}

}  // namespace gclab::io
