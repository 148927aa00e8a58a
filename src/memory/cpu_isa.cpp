#include "gclab/memory/cpu_isa.h"

#include <ATen/Version.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace gclab::memory {

bool cpu_has(const char* flag) {
  static const auto caps = at::cpu::get_cpu_capabilities();
  const auto it = caps.find(flag);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

bool aten_avx2() {
  const std::string capability = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512" (x86-64; others elsewhere)
  return capability == "AVX2" || capability == "AVX512";
}

namespace {

// The best tier this CPU's flags reach (oneDNN's cpu_isa_traits: each tier adds its flags to the last).
OnednnIsa hardware_isa() {
  if (!cpu_has("avx2") || !cpu_has("fma3")) return OnednnIsa::older;
  if (!(cpu_has("avx512_f") && cpu_has("avx512_bw") && cpu_has("avx512_vl") && cpu_has("avx512_dq")))
    return OnednnIsa::avx2;
  if (!cpu_has("avx512_vnni")) return OnednnIsa::avx512_core;
  if (!cpu_has("avx512_bf16")) return OnednnIsa::avx512_core_vnni;
  if (!cpu_has("avx512_fp16")) return OnednnIsa::avx512_core_bf16;
  if (!(cpu_has("amx_tile") && cpu_has("amx_bf16") && cpu_has("amx_int8"))) return OnednnIsa::avx512_core_fp16;
  return OnednnIsa::avx512_core_amx;
}

// ONEDNN_MAX_CPU_ISA's values (oneDNN's dnnl_cpu_isa_t names, case-insensitive) as tiers; an unknown value
// or none leaves the hardware's.
OnednnIsa environment_cap() {
  const char* value = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (value == nullptr) value = std::getenv("DNNL_MAX_CPU_ISA");
  if (value == nullptr) return OnednnIsa::avx512_core_amx;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::array<std::pair<std::string_view, OnednnIsa>, 14> names = {{
      {"SSE41", OnednnIsa::older},
      {"AVX", OnednnIsa::older},
      {"AVX2", OnednnIsa::avx2},
      {"AVX2_VNNI", OnednnIsa::avx2},
      {"AVX2_VNNI_2", OnednnIsa::avx2},
      {"AVX512_CORE", OnednnIsa::avx512_core},
      {"AVX512_CORE_VNNI", OnednnIsa::avx512_core_vnni},
      {"AVX512_CORE_BF16", OnednnIsa::avx512_core_bf16},
      {"AVX512_CORE_FP16", OnednnIsa::avx512_core_fp16},
      {"AVX10_1_512", OnednnIsa::avx512_core_fp16},
      {"AVX512_CORE_AMX", OnednnIsa::avx512_core_amx},
      {"AVX10_1_512_AMX", OnednnIsa::avx512_core_amx},
      {"AVX512_CORE_AMX_FP16", OnednnIsa::avx512_core_amx},
      {"AVX10_1_512_AMX_FP16", OnednnIsa::avx512_core_amx},
  }};
  for (const auto& [name, isa] : names)
    if (v == name) return isa;
  return OnednnIsa::avx512_core_amx;  // ALL, DEFAULT
}

}  // namespace

OnednnIsa onednn_isa() {
  static const OnednnIsa isa = std::min(hardware_isa(), environment_cap());
  return isa;
}

std::string name_of(OnednnIsa isa) {
  switch (isa) {
    case OnednnIsa::older:
      return "sse41/avx";
    case OnednnIsa::avx2:
      return "avx2";
    case OnednnIsa::avx512_core:
      return "avx512_core";
    case OnednnIsa::avx512_core_vnni:
      return "avx512_core_vnni";
    case OnednnIsa::avx512_core_bf16:
      return "avx512_core_bf16";
    case OnednnIsa::avx512_core_fp16:
      return "avx512_core_fp16";
    case OnednnIsa::avx512_core_amx:
      return "avx512_core_amx";
  }
  return "unknown";
}

bool cpu_onednn_bf16() { return onednn_isa() >= OnednnIsa::avx512_core; }

int cpu_channel_block() { return onednn_isa() >= OnednnIsa::avx512_core ? 16 : 8; }

namespace {

// Which bounds an ISA gets: where they were measured (docs/results/cpu-isa.md).
enum class Tier { slow_path, native_bf16, emulated_bf16, amx };

Tier tier() {
  switch (onednn_isa()) {
    case OnednnIsa::avx2:
      return Tier::slow_path;  // bf16 off oneDNN: slow_conv2d, ATen's own matmul (ONEDNN_MAX_CPU_ISA=AVX2)
    case OnednnIsa::avx512_core:
    case OnednnIsa::avx512_core_vnni:
      return Tier::emulated_bf16;  // oneDNN's bf16 without BF16 instructions (ONEDNN_MAX_CPU_ISA=AVX512_CORE)
    case OnednnIsa::avx512_core_bf16:
    case OnednnIsa::avx512_core_fp16:
      return Tier::native_bf16;  // an AMD EPYC with AVX-512 BF16, an Intel Xeon with AVX-512 FP16
    case OnednnIsa::older:
    case OnednnIsa::avx512_core_amx:
      break;
  }
  return Tier::amx;  // measured on an Intel Xeon with AMX; below AVX2 unmeasured, held to the widest bounds
}

const char* rule_name(CpuRule rule) {
  switch (rule) {
    case CpuRule::convolution:
      return "convolution";
    case CpuRule::autoencoder:
      return "autoencoder encode / decode";
    case CpuRule::forward:
      return "transformer forward";
    case CpuRule::backward:
      return "transformer backward";
    case CpuRule::text_encode:
      return "text encoder encode";
  }
  return "?";
}

constexpr CpuRule kRules[] = {CpuRule::convolution, CpuRule::autoencoder, CpuRule::forward, CpuRule::backward,
                              CpuRule::text_encode};

std::string range(const CpuRuleBound& b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f-%.2f", b.low, b.high);
  return buf;
}

}  // namespace

// The measured ranges of predicted / measured, each widened a little: the lowest and highest ratio seen over
// the tests' cases on that tier (the figures in docs/results/cpu-isa.md).
CpuRuleBound cpu_bf16_bound(CpuRule rule) {
  const Tier t = tier();
  switch (rule) {
    // 1.000 on the first three tiers; AMX 0.41-0.92 on the review's Xeon, 0.30-4.00 on the Xeon of 2026-12-05
    // (oneDNN's brgemm kernels there: a 1x1's copies over-predicted up to 4x, a small 3x3's scratchpad under)
    case CpuRule::convolution:
      return t == Tier::amx ? CpuRuleBound{0.25, 4.5, false} : CpuRuleBound{0.99, 1.01, true};
    case CpuRule::autoencoder:  // 1.000 on the first three; AMX 0.76-1.11
      return t == Tier::amx ? CpuRuleBound{0.70, 1.15, false} : CpuRuleBound{0.98, 1.02, true};
    // the slow path exact; native 0.966-1.011; emulated 0.953-1.044, down to 0.749 for a no-graph forward of
    // the fused BFL Linears (FLUX.2 klein's 9-wide linear1, Chroma's 0.914: its oneDNN scratch grows with the
    // output width there, which the rule does not count); AMX down to 0.860
    case CpuRule::forward:
      if (t == Tier::slow_path) return {0.999, 1.001, true};
      if (t == Tier::native_bf16) return {0.96, 1.02, true};
      return t == Tier::emulated_bf16 ? CpuRuleBound{0.74, 1.06, false} : CpuRuleBound{0.84, 1.12, false};
    case CpuRule::backward:  // the slow path exact; native 0.850-1.000; emulated 0.478-1.000; AMX >= 0.8
      if (t == Tier::slow_path) return {0.999, 1.001, true};
      if (t == Tier::native_bf16) return {0.84, 1.0, true};
      return t == Tier::emulated_bf16 ? CpuRuleBound{0.45, 1.0, false} : CpuRuleBound{0.80, 1.0, false};
    case CpuRule::text_encode:  // slow path 0.998-1.000; native 0.990-1.000; emulated 0.668-1.000; AMX +-8%
      if (t == Tier::slow_path || t == Tier::native_bf16) return {0.98, 1.02, true};
      return t == Tier::emulated_bf16 ? CpuRuleBound{0.62, 1.01, false} : CpuRuleBound{0.92, 1.08, false};
  }
  return {};
}

bool cpu_rules_measured(int64_t dtype_bytes) {
  const OnednnIsa isa = onednn_isa();
  if (isa == OnednnIsa::older) return false;
  if (dtype_bytes == 4) return true;
  for (const CpuRule rule : kRules)
    if (!cpu_bf16_bound(rule).exact) return false;
  return true;
}

std::string cpu_rules_caveat(int64_t dtype_bytes) {
  if (cpu_rules_measured(dtype_bytes)) return {};
  const OnednnIsa isa = onednn_isa();
  if (isa == OnednnIsa::older)
    return "the CPU kernels' temporaries on this CPU (oneDNN dispatches for " + name_of(isa) +
           ", below the AVX2 the rules were measured on): predicted as AVX2's, unchecked here";
  std::string ranges;
  for (const CpuRule rule : kRules) {
    const CpuRuleBound b = cpu_bf16_bound(rule);
    if (!b.exact) ranges += std::string(ranges.empty() ? "" : ", ") + rule_name(rule) + " " + range(b);
  }
  return "oneDNN's bf16 kernels on this CPU (" + name_of(isa) +
         ") hold temporaries other than those the rules were measured for; predicted / measured there: " + ranges +
         " (docs/results/cpu-isa.md)";
}

std::string describe(CpuRule rule) {
  const CpuRuleBound b = cpu_bf16_bound(rule);
  return std::string("bf16 ") + rule_name(rule) + " on " + name_of(onednn_isa()) + ": predicted / measured in " +
         range(b) + (b.exact ? ", exact here" : ", bounded here");
}

}  // namespace gclab::memory
