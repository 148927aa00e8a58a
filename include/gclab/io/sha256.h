// SHA-256 (FIPS 180-4) of a byte string, as lowercase hex: the hashes AI Toolkit writes into a LoRA file's
// metadata (toolkit/metadata.py add_model_hash_to_meta: sd-webui-additional-networks' sshs_model_hash and
// sshs_legacy_hash), computed here without another dependency.
#pragma once

#include <string>
#include <string_view>

namespace gclab::io {

std::string sha256_hex(std::string_view bytes);

}  // namespace gclab::io
