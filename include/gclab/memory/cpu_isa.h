// Which CPU kernels this process runs, as far as their memory goes: the instruction set oneDNN dispatches
// its kernels for, and whether gclab's rules for those kernels' temporaries (memory/live_set.h) were measured
// on it. The CPU's memory rules are exact only on the ISA they were measured on; elsewhere the walk's
// prediction says so (predict.cpp's not_modelled) and the tests hold the bound measured there
// (docs/results/cpu-isa.md).
#pragma once

#include <cstdint>
#include <string>

namespace gclab::memory {

// A flag of this CPU as ATen reads it (at::cpu::get_cpu_capabilities, cpuinfo's CPUID reading: "avx512_f",
// "avx512_bw", "amx_bf16", ...).
bool cpu_has(const char* flag);

// Whether ATen's own vectorised kernels run at AVX2 or above in this process (its CPU capability, capped by
// ATEN_CPU_CAPABILITY): where they do, a uint8 image resize is AVX2's kernel, with its own buffers
// (nn::resize_bicubic_aa); below, the generic separable one.
bool aten_avx2();

// oneDNN's ISA tiers, in its order, as far as they change what its kernels allocate.
enum class OnednnIsa {
  older,             // SSE4.1 / AVX: not measured
  avx2,              // AVX2 (and AVX2_VNNI / AVX2_VNNI_2)
  avx512_core,       // AVX-512 F, BW, VL, DQ
  avx512_core_vnni,  // + VNNI
  avx512_core_bf16,  // + BF16
  avx512_core_fp16,  // + FP16 (oneDNN's AVX10_1_512)
  avx512_core_amx,   // + AMX tiles with bf16 / int8 (AVX10_1_512_AMX, and AMX_FP16)
};

// The ISA oneDNN dispatches for in this process: the best tier this CPU's flags reach, capped by
// ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) as oneDNN reads it (its CPU dispatcher control: the environment
// is read once, before its first kernel). PyTorch follows the same tier: it runs bf16 convolutions and
// matmuls through oneDNN only from avx512_core up (measured: under ONEDNN_MAX_CPU_ISA=AVX2 a bf16
// convolution takes slow_conv2d, as on a CPU without AVX-512).
OnednnIsa onednn_isa();

// oneDNN's name for it ("avx2", "avx512_core_amx", ...).
std::string name_of(OnednnIsa isa);

// Whether this CPU runs bf16 matmuls and convolutions through oneDNN (onednn_isa() from avx512_core up).
// Where it does, a bf16 matmul allocates oneDNN's scratch for a moment beside its output
// (cpu_onednn_matmul_scratch), which the walks hold for the Linears' forwards (nn::linear) but not yet for the
// backward's matmuls (listed in the estimate's not_modelled). Where it does not, a bf16 convolution runs
// slow_conv2d with its im2col columns (cpu_convolution_temporaries).
bool cpu_onednn_bf16();

// oneDNN's channel block for float32 and bf16 convolutions: 16 from avx512_core up, else 8.
int cpu_channel_block();

// The memory rules whose accuracy on the CPU depends on the ISA oneDNN dispatches for.
enum class CpuRule {
  convolution,  // one convolution's temporaries (cpu_convolution_temporaries)
  autoencoder,  // an autoencoder's encode or decode peak (its convolutions, norms and attention)
  forward,      // a transformer's forward peak (the Linears' oneDNN scratch: cpu_onednn_matmul_scratch)
  backward,     // its backward's peak (the backward's matmul scratch is not walked: the walk is at or below)
  text_encode,  // a text encoder's encode peak
};

// What a bf16 prediction of `rule` is held to on this process's ISA: predicted / measured within [low,
// high], as measured on that ISA (docs/results/cpu-isa.md); `exact` where the rules were measured to be
// exact there (AVX2, AVX-512 BF16 without AMX), false where they are only bounded (AVX-512 without BF16,
// AMX, and below AVX2, which takes AMX's bounds unmeasured). float32's rules are exact on every ISA from
// AVX2 up, AMX included.
struct CpuRuleBound {
  double low = 1, high = 1;
  bool exact = true;
};
CpuRuleBound cpu_bf16_bound(CpuRule rule);

// Whether the CPU kernels' memory rules for a dtype of `dtype_bytes` are exact on this ISA: float32 from AVX2
// up; bf16 on AVX2 (slow_conv2d, no oneDNN) and AVX-512 with BF16 without AMX (oneDNN's native bf16 kernels).
bool cpu_rules_measured(int64_t dtype_bytes);

// What a prediction says where they are not: the ISA, what differs, and the bounds measured there; empty
// where they are exact.
std::string cpu_rules_caveat(int64_t dtype_bytes);

// The bound a test holds `rule` to here, as one line: "bf16 autoencoder on avx2: [0.98, 1.02], exact".
std::string describe(CpuRule rule);

}  // namespace gclab::memory
