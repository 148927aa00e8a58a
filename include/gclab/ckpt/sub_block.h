// The two sub-blocks a transformer block calls (model/blocks.h) and a selective checkpoint policy picks one
// of (selective:attn, selective:mlp): a type, so the block, the wrapper and the policy name them alike.
#pragma once

namespace gclab::ckpt {

enum class SubBlock { attn, mlp };

// "attn", "mlp": the checkpoint's name suffix and the policy's spelling.
constexpr const char* name_of(SubBlock kind) { return kind == SubBlock::attn ? "attn" : "mlp"; }

}  // namespace gclab::ckpt
