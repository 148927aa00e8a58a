// The C interface of libgclab_video.so, the module that holds FFmpeg (libavformat, libavcodec, libswscale):
// gclab loads it when it first meets a video file (data/video.cpp), so a machine or a bundle without FFmpeg's
// libraries runs everything else. Frames are RGB24, rows packed. Each call returns 0, or -1 with a message
// naming the file in `error` (at most error_size bytes, NUL-terminated).
#pragma once

#include <cstdint>

extern "C" {

// The interface's version: the loader refuses a module of another.
int gclab_video_abi();

int gclab_video_probe(const char* path, int* width, int* height, int* frames, double* fps, char* error, int error_size);

// Calls sink(context, k, rgb, width, height) for each indices[k], in decoding order (a frame asked twice,
// twice); an index past the last frame that decodes is given that last frame. `decoded` is the number of
// frames decoded (0: none, and nothing given).
typedef void (*gclab_video_sink)(void* context, int k, const uint8_t* rgb, int width, int height);
int gclab_video_decode(const char* path, const int* indices, int count, gclab_video_sink sink, void* context,
                       int* decoded, char* error, int error_size);

// `frames` is count x height x width x 3 bytes; the extension picks the container and codec.
int gclab_video_write(const char* path, const uint8_t* frames, int count, int height, int width, int fps, char* error,
                      int error_size);
}
