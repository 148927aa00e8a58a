// Checkpoint policies: which blocks of a model are checkpointed, and how. Parsed from
// `train.checkpoint_policy`; applied to an already built model by apply_checkpoint_policy (wrapper.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gclab::ckpt {

// What happens to one block.
enum class BlockMode {
  None,           // activations kept (no recompute)
  Full,           // the whole block recomputed in backward; only its inputs kept
  Offload,        // as Full, with the kept inputs in host memory
  SelectiveAttn,  // only the attention sub-block recomputed
  SelectiveMlp,   // only the MLP sub-block recomputed
  SelectiveOps,   // the whole block recomputed but for its matmuls and attention, whose outputs are kept
};

const char* to_string(BlockMode mode);

// The blocks' modes one by one in short names (none, full, offload, attn, mlp, ops), runs of one mode as
// "full*3": what modes:[...] is written as.
std::string short_name(BlockMode mode);

struct CheckpointPolicy {
  enum class Kind {
    Off,
    Full,
    EveryN,
    FirstK,
    Blocks,
    SelectiveAttn,
    SelectiveMlp,
    SelectiveOps,
    Offload,
    Budget,
    Auto,
    Modes
  };
  Kind kind = Kind::Full;
  int n = 0;                // every:N and first:K
  std::vector<int> blocks;  // blocks:[i,j,...]
  std::int64_t budget_bytes = 0;
  // auto:MARGIN: what is left free of the cap, in bytes, or as a fraction of the cap (auto:5%). Neither
  // given (plain auto): kAutoMarginFraction.
  std::int64_t margin_bytes = -1;
  double margin_fraction = -1;
  static constexpr double kAutoMarginFraction = 0.05;
  std::vector<BlockMode> modes;  // modes:[...]: one per block, in the model's order

  // "off" | "full" | "every:N" | "first:K" | "blocks:[i,j]" | "selective:attn" | "selective:mlp" |
  // "selective:ops" |
  // "offload" | "budget:24GiB" | "auto" | "auto:1GiB" | "auto:5%" | "modes:[full*2,none,attn]". Throws
  // std::invalid_argument with a message naming the grammar.
  static CheckpointPolicy parse(const std::string& text);
  std::string to_string() const;
  // The policies as values (what code builds; parse() is for what people write).
  static CheckpointPolicy off() { return of(Kind::Off); }
  static CheckpointPolicy full() { return of(Kind::Full); }
  // Exactly these blocks (sorted, each once); none: off.
  static CheckpointPolicy only_blocks(std::vector<int> blocks);
  // One mode a block (off when every one is none, full when every one is full).
  static CheckpointPolicy per_block(std::vector<BlockMode> modes);
  // The bytes auto keeps free of `cap_bytes`.
  std::int64_t margin_of(std::int64_t cap_bytes) const;

  // The mode of block `index` of `num_blocks`. A budget or auto policy has no fixed answer: it is decided
  // from the walk (select_blocks_for_budget; train::MemoryModel::auto_plan) and applied as blocks:[...] or
  // modes:[...]. modes:[...] of another length than num_blocks is refused (std::invalid_argument).
  BlockMode mode_for(int index, int num_blocks) const;

 private:
  static CheckpointPolicy of(Kind kind) {
    CheckpointPolicy p;
    p.kind = kind;
    return p;
  }
};

// Which blocks to checkpoint so that the activations kept during a step fit `budget_bytes`: block i
// keeps activation_bytes[i] without checkpointing and input_bytes[i] with it. Checkpoints the fewest
// blocks (largest savings first); returns their indices in ascending order. When even every block
// checkpointed does not fit, returns all of them.
std::vector<int> select_blocks_for_budget(const std::vector<std::int64_t>& activation_bytes,
                                          const std::vector<std::int64_t>& input_bytes, std::int64_t budget_bytes);

}  // namespace gclab::ckpt
