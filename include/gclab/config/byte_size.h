// Byte sizes as people write them ("24GiB", "512 MiB", "24GB", "1e9") and as people read them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gclab::config {

// Parses a size. Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB)
// are powers of 1000, the way GPU vendors label cards; a bare number is bytes. Case-insensitive,
// spaces allowed between number and unit. Returns nullopt for anything else, negative or overflowing.
std::optional<std::int64_t> parse_byte_size(const std::string& text);

// "23.99 GiB", "512.00 MiB", "12 B": for people. Files carry plain byte counts.
std::string format_bytes(std::int64_t bytes);

// The shortest exact spelling: "24GiB" when the value is a whole number of GiB, else plain bytes.
std::string format_bytes_exact(std::int64_t bytes);

}  // namespace gclab::config
