#include "video_ffmpeg.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;

// What fails, naming the file; turned into the C interface's -1 and message at its edge.
struct VideoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string av_error(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, text, sizeof text);
  return text;
}

// FFmpeg logs to stderr (x264's statistics, a demuxer's complaints about a broken file): gclab says what
// failed in its own errors, naming the file.
void quiet_ffmpeg() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_FATAL); });
}

struct FormatCloser {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct ScaleFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
struct ScaleGuard {  // sws_getCachedContext's context, which it may free and replace
  SwsContext* context = nullptr;
  ~ScaleGuard() { sws_freeContext(context); }
};
using Frame = std::unique_ptr<AVFrame, FrameFree>;
using Packet = std::unique_ptr<AVPacket, PacketFree>;

// An opened input and its first video stream.
struct Input {
  std::unique_ptr<AVFormatContext, FormatCloser> format;
  int stream = -1;
  AVStream* video() const { return format->streams[stream]; }
};

Input open_input(const fs::path& path) {
  quiet_ffmpeg();
  AVFormatContext* raw = nullptr;
  if (int e = avformat_open_input(&raw, path.c_str(), nullptr, nullptr); e < 0)
    throw VideoError(path.string() + ": cannot open as a video (" + av_error(e) + ")");
  Input in;
  in.format.reset(raw);
  if (int e = avformat_find_stream_info(raw, nullptr); e < 0)
    throw VideoError(path.string() + ": cannot read its streams (" + av_error(e) + ")");
  in.stream = av_find_best_stream(raw, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (in.stream < 0) throw VideoError(path.string() + ": has no video stream");
  return in;
}

void to_rgb(SwsContext*& scale, const AVFrame& frame, std::vector<uint8_t>& out) {
  scale = sws_getCachedContext(scale, frame.width, frame.height, static_cast<AVPixelFormat>(frame.format), frame.width,
                               frame.height, AV_PIX_FMT_RGB24, SWS_BICUBIC, nullptr, nullptr, nullptr);
  if (!scale) throw VideoError("cannot convert a frame of pixel format " + std::to_string(frame.format) + " to RGB");
  out.resize(static_cast<size_t>(frame.height) * static_cast<size_t>(frame.width) * 3);
  uint8_t* dst[4] = {out.data(), nullptr, nullptr, nullptr};
  int stride[4] = {3 * frame.width, 0, 0, 0};
  sws_scale(scale, frame.data, frame.linesize, 0, frame.height, dst, stride);
}

void probe(const fs::path& path, int* width, int* height, int* frames, double* fps) {
  Input in = open_input(path);
  AVStream* st = in.video();
  *width = st->codecpar->width, *height = st->codecpar->height;
  *fps = av_q2d(av_guess_frame_rate(in.format.get(), st, nullptr));
  if (!std::isfinite(*fps) || *fps < 0) *fps = 0;  // a container without a rate (OpenCV's CAP_PROP_FPS: 0)
  *frames = static_cast<int>(st->nb_frames);
  if (*frames <= 0) {  // WebM and GIF headers do not say: count the stream's packets, a frame each
    Packet packet(av_packet_alloc());
    *frames = 0;
    while (av_read_frame(in.format.get(), packet.get()) >= 0) {
      if (packet->stream_index == in.stream) ++*frames;
      av_packet_unref(packet.get());
    }
  }
  if (*width <= 0 || *height <= 0 || *frames <= 0)
    throw VideoError(path.string() + ": its video stream has no frames or no size");
}

int decode(const fs::path& path, const std::vector<int>& indices, gclab_video_sink sink, void* context) {
  Input in = open_input(path);
  const AVCodecParameters* par = in.video()->codecpar;
  const AVCodec* codec = avcodec_find_decoder(par->codec_id);
  if (!codec) throw VideoError(path.string() + ": no decoder for its codec (" + avcodec_get_name(par->codec_id) + ")");
  std::unique_ptr<AVCodecContext, CodecCloser> ctx(avcodec_alloc_context3(codec));
  avcodec_parameters_to_context(ctx.get(), par);
  ctx->thread_count = 1;
  if (int e = avcodec_open2(ctx.get(), codec, nullptr); e < 0)
    throw VideoError(path.string() + ": cannot open its decoder (" + av_error(e) + ")");

  const int last_wanted = *std::max_element(indices.begin(), indices.end());
  ScaleGuard scale;
  Packet packet(av_packet_alloc());
  Frame frame(av_frame_alloc()), previous(av_frame_alloc());
  std::vector<uint8_t> rgb;
  int n = 0;
  auto drain = [&] {
    int e = 0;
    while ((e = avcodec_receive_frame(ctx.get(), frame.get())) == 0) {
      bool converted = false;
      for (size_t k = 0; k < indices.size(); ++k) {
        if (indices[k] != n) continue;
        if (!converted) to_rgb(scale.context, *frame, rgb), converted = true;
        sink(context, static_cast<int>(k), rgb.data(), frame->width, frame->height);
      }
      av_frame_unref(previous.get());
      av_frame_move_ref(previous.get(), frame.get());
      ++n;
    }
    if (e != AVERROR(EAGAIN) && e != AVERROR_EOF)
      throw VideoError(path.string() + ": frame " + std::to_string(n) + " does not decode (" + av_error(e) + ")");
  };
  while (n <= last_wanted && av_read_frame(in.format.get(), packet.get()) >= 0) {
    if (packet->stream_index == in.stream) {
      int e = avcodec_send_packet(ctx.get(), packet.get());
      if (e == AVERROR(EAGAIN)) {  // the decoder is full: take its frames, then the packet
        drain();
        e = avcodec_send_packet(ctx.get(), packet.get());
      }
      if (e < 0)
        throw VideoError(path.string() + ": frame " + std::to_string(n) + " does not decode (" + av_error(e) + ")");
      drain();
    }
    av_packet_unref(packet.get());
  }
  if (n <= last_wanted) {  // the decoder's delayed frames
    avcodec_send_packet(ctx.get(), nullptr);
    drain();
  }
  // Frames asked past the last that decodes get the last (AI Toolkit clamps indices to the last frame).
  if (n > 0 && n <= last_wanted) {
    to_rgb(scale.context, *previous, rgb);
    for (size_t k = 0; k < indices.size(); ++k)
      if (indices[k] >= n) sink(context, static_cast<int>(k), rgb.data(), previous->width, previous->height);
  }
  return n;
}

struct Output {
  AVFormatContext* format = nullptr;
  ~Output() {
    if (format && !(format->oformat->flags & AVFMT_NOFILE)) avio_closep(&format->pb);
    avformat_free_context(format);
  }
};

// The encoder an extension gets, its pixel format and options.
struct EncoderChoice {
  const AVCodec* codec = nullptr;
  AVPixelFormat pixels = AV_PIX_FMT_YUV420P;
  std::vector<std::pair<const char*, const char*>> options;
};

EncoderChoice choose_encoder(const std::string& ext) {
  EncoderChoice c;
  if (ext == ".gif") {
    c.codec = avcodec_find_encoder(AV_CODEC_ID_GIF), c.pixels = AV_PIX_FMT_RGB8;
  } else if (ext == ".webm") {
    c.codec = avcodec_find_encoder_by_name("libvpx-vp9");
    c.options = {{"crf", "24"}, {"b", "0"}, {"deadline", "realtime"}, {"cpu-used", "8"}};
  } else if ((c.codec = avcodec_find_encoder_by_name("libx264"))) {
    c.options = {{"crf", "18"}, {"preset", "veryfast"}};
  } else {
    c.codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
  }
  return c;
}

void write(const fs::path& path, const uint8_t* frames, int count, int height_in, int width_in, int fps) {
  quiet_ffmpeg();
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  const AVOutputFormat* container = av_guess_format(nullptr, path.filename().c_str(), nullptr);
  EncoderChoice choice = choose_encoder(ext);
  if (!container || !choice.codec ||
      (ext != ".mp4" && ext != ".mov" && ext != ".mkv" && ext != ".webm" && ext != ".gif"))
    throw VideoError(path.string() + ": write .mp4, .mov, .mkv, .webm or .gif (this FFmpeg has no encoder for '" + ext +
                     "')");
  const bool even = choice.pixels == AV_PIX_FMT_YUV420P;
  const int height = height_in & (even ? ~1 : ~0), width = width_in & (even ? ~1 : ~0);
  if (width < 2 || height < 2)
    throw VideoError(path.string() + ": frames of " + std::to_string(width) + "x" + std::to_string(height) +
                     " are too small to encode");
  const fs::path part = path.parent_path() / ("." + path.filename().string() + ".part");
  auto fail = [&](const std::string& what, int e) {
    std::error_code ec;
    fs::remove(part, ec);
    throw VideoError(path.string() + ": " + what + (e < 0 ? " (" + av_error(e) + ")" : ""));
  };

  Output out;
  if (int e = avformat_alloc_output_context2(&out.format, container, nullptr, part.c_str()); e < 0)
    fail("cannot make the container", e);
  AVStream* stream = avformat_new_stream(out.format, nullptr);
  std::unique_ptr<AVCodecContext, CodecCloser> enc(avcodec_alloc_context3(choice.codec));
  enc->width = width, enc->height = height, enc->pix_fmt = choice.pixels;
  enc->time_base = AVRational{1, fps}, enc->framerate = AVRational{fps, 1};
  enc->gop_size = 12, enc->thread_count = 1;
  if (choice.codec->id == AV_CODEC_ID_MPEG4) enc->flags |= AV_CODEC_FLAG_QSCALE, enc->global_quality = FF_QP2LAMBDA * 2;
  if (out.format->oformat->flags & AVFMT_GLOBALHEADER) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* options = nullptr;
  for (const auto& [k, v] : choice.options) av_dict_set(&options, k, v, 0);
  int e = avcodec_open2(enc.get(), choice.codec, &options);
  av_dict_free(&options);
  if (e < 0) fail("cannot open the " + std::string(choice.codec->name) + " encoder", e);
  avcodec_parameters_from_context(stream->codecpar, enc.get());
  stream->time_base = enc->time_base;
  if (!(out.format->oformat->flags & AVFMT_NOFILE))
    if ((e = avio_open(&out.format->pb, part.c_str(), AVIO_FLAG_WRITE)) < 0) fail("cannot write", e);
  if ((e = avformat_write_header(out.format, nullptr)) < 0) fail("cannot write the header", e);

  Packet packet(av_packet_alloc());
  auto send = [&](const AVFrame* f) {
    if (int r = avcodec_send_frame(enc.get(), f); r < 0) fail("cannot encode a frame", r);
    while (avcodec_receive_packet(enc.get(), packet.get()) == 0) {
      // Each frame lasts one tick of 1/fps: without a duration the MP4 muxer's edit list ends where the last
      // frame starts, and demuxers drop that frame.
      if (packet->duration <= 0) packet->duration = 1;
      av_packet_rescale_ts(packet.get(), enc->time_base, stream->time_base);
      packet->stream_index = stream->index;
      if (int r = av_interleaved_write_frame(out.format, packet.get()); r < 0) fail("cannot write a frame", r);
    }
  };
  std::unique_ptr<SwsContext, ScaleFree> scale(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height,
                                                              choice.pixels, SWS_BICUBIC, nullptr, nullptr, nullptr));
  Frame frame(av_frame_alloc());
  frame->format = choice.pixels, frame->width = width, frame->height = height;
  if ((e = av_frame_get_buffer(frame.get(), 0)) < 0) fail("cannot allocate a frame", e);
  for (int i = 0; i < count; ++i) {
    if ((e = av_frame_make_writable(frame.get())) < 0) fail("cannot allocate a frame", e);
    // An odd side's last row or column is left out: the source's rows keep their full stride.
    const uint8_t* src[4] = {frames + static_cast<size_t>(i) * height_in * width_in * 3, nullptr, nullptr, nullptr};
    const int stride[4] = {3 * width_in, 0, 0, 0};
    sws_scale(scale.get(), src, stride, 0, height, frame->data, frame->linesize);
    frame->pts = i;
    send(frame.get());
  }
  send(nullptr);
  if ((e = av_write_trailer(out.format)) < 0) fail("cannot finish the file", e);
  if (!(out.format->oformat->flags & AVFMT_NOFILE)) avio_closep(&out.format->pb);
  std::error_code ec;
  fs::rename(part, path, ec);
  if (ec) fail("cannot rename " + part.string() + " into place: " + ec.message(), 0);
}

// Runs f, turning a failure into -1 and its message.
template <class F>
int guarded(char* error, int error_size, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    if (error && error_size > 0) {
      std::strncpy(error, e.what(), static_cast<size_t>(error_size) - 1);
      error[error_size - 1] = 0;
    }
    return -1;
  }
}

}  // namespace

extern "C" {

int gclab_video_abi() { return 1; }

int gclab_video_probe(const char* path, int* width, int* height, int* frames, double* fps, char* error,
                      int error_size) {
  return guarded(error, error_size, [&] { probe(path, width, height, frames, fps); });
}

int gclab_video_decode(const char* path, const int* indices, int count, gclab_video_sink sink, void* context,
                       int* decoded, char* error, int error_size) {
  return guarded(error, error_size, [&] {
    *decoded = count > 0 ? decode(path, std::vector<int>(indices, indices + count), sink, context) : 0;
  });
}

int gclab_video_write(const char* path, const uint8_t* frames, int count, int height, int width, int fps, char* error,
                      int error_size) {
  return guarded(error, error_size, [&] { write(path, frames, count, height, width, fps); });
}
}
