// Video files through libgclab_video.so (src/data/video_ffmpeg.cpp), loaded on first use: FFmpeg's libraries
// and the hundred-odd codec libraries Debian links them with are loaded only by a run that meets a video, and
// a machine without them (or the GPU check's bundle, docs/gpu.md) runs everything else.
#include "gclab/data/video.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "video_ffmpeg.h"

namespace gclab::data {
namespace fs = std::filesystem;

namespace {

struct Module {
  decltype(&gclab_video_probe) probe = nullptr;
  decltype(&gclab_video_decode) decode = nullptr;
  decltype(&gclab_video_write) write = nullptr;
  std::string why;  // why it did not load
};

// Where libgclab_video.so is looked for: $GCLAB_VIDEO_LIBRARY, else beside the executable's folder in lib/
// (the build's layout: bin/gclab, lib/libgclab_video.so), else the executable's own folder.
std::vector<fs::path> module_candidates() {
  if (const char* env = std::getenv("GCLAB_VIDEO_LIBRARY"); env && *env) return {env};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec).parent_path();
  return {exe.parent_path() / "lib" / "libgclab_video.so", exe / "libgclab_video.so"};
}

const Module& module() {
  static Module m;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const fs::path& file : module_candidates()) {
      void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char* e = dlerror();
        m.why += (m.why.empty() ? "" : "; ") + std::string(e ? e : file.c_str());
        continue;
      }
      auto abi = reinterpret_cast<decltype(&gclab_video_abi)>(dlsym(handle, "gclab_video_abi"));
      if (!abi || abi() != 1) {
        dlclose(handle);
        m.why += (m.why.empty() ? "" : "; ") + file.string() + " is of another gclab";
        continue;
      }
      auto probe = reinterpret_cast<decltype(m.probe)>(dlsym(handle, "gclab_video_probe"));
      auto decode = reinterpret_cast<decltype(m.decode)>(dlsym(handle, "gclab_video_decode"));
      auto write = reinterpret_cast<decltype(m.write)>(dlsym(handle, "gclab_video_write"));
      if (probe && decode && write) {
        m.probe = probe, m.decode = decode, m.write = write;
        return;
      }
      dlclose(handle);
      m.why += (m.why.empty() ? "" : "; ") + file.string() + " lacks gclab's video functions";
    }
  });
  if (!m.probe)
    throw VideoError(
        "video files need libgclab_video.so and FFmpeg's libraries (scripts/setup.sh installs them; "
        "GCLAB_VIDEO_LIBRARY names the module): " +
        m.why);
  return m;
}

}  // namespace

bool video_support(std::string* why) {
  try {
    module();
    return true;
  } catch (const VideoError& e) {
    if (why) *why = e.what();
    return false;
  }
}

namespace {

struct Message {
  char text[1024] = {0};
};

}  // namespace

bool is_video_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* e : {".mp4", ".avi", ".mov", ".webm", ".mkv", ".wmv", ".m4v", ".flv", ".gif"})
    if (ext == e) return true;
  return false;
}

std::optional<VideoInfo> probe_video(const fs::path& path, std::string* error) {
  try {
    const Module& m = module();
    VideoInfo info;
    Message why;
    if (m.probe(path.c_str(), &info.width, &info.height, &info.frames, &info.fps, why.text, sizeof why.text) == 0)
      return info;
    if (error) *error = why.text;
  } catch (const VideoError& e) {
    if (error) *error = e.what();
  }
  return std::nullopt;
}

std::vector<torch::Tensor> decode_video_frames(const fs::path& path, const std::vector<int>& indices) {
  if (indices.empty()) return {};
  if (*std::min_element(indices.begin(), indices.end()) < 0)
    throw VideoError(path.string() + ": a frame index below 0 was asked for");
  const Module& m = module();
  std::vector<torch::Tensor> got(indices.size());
  auto sink = [](void* context, int k, const uint8_t* rgb, int width, int height) {
    auto& out = *static_cast<std::vector<torch::Tensor>*>(context);
    out[static_cast<size_t>(k)] =
        torch::from_blob(const_cast<uint8_t*>(rgb), {height, width, 3}, torch::kUInt8).clone();
  };
  Message why;
  int decoded = 0;
  if (m.decode(path.c_str(), indices.data(), static_cast<int>(indices.size()), sink, &got, &decoded, why.text,
               sizeof why.text) != 0)
    throw VideoError(why.text);
  if (decoded == 0) throw VideoError(path.string() + ": no frame decodes");
  return got;
}

void write_video(const fs::path& path, const torch::Tensor& frames_in, int fps) {
  if (frames_in.dim() != 4 || frames_in.size(3) != 3 || frames_in.scalar_type() != torch::kUInt8 || fps <= 0 ||
      frames_in.size(0) < 1)
    throw VideoError("write_video needs uint8 [F, H, W, 3] with a frame or more, and fps above 0");
  const Module& m = module();
  const torch::Tensor frames = frames_in.contiguous();
  Message why;
  if (m.write(path.c_str(), frames.data_ptr<uint8_t>(), static_cast<int>(frames.size(0)),
              static_cast<int>(frames.size(1)), static_cast<int>(frames.size(2)), fps, why.text, sizeof why.text) != 0)
    throw VideoError(why.text);
}

}  // namespace gclab::data
