#include "gclab/io/pickle.h"

#include <cstdint>
#include <cstring>

namespace gclab::io {

namespace {

// The opcodes used (Lib/pickle.py).
constexpr char kProto = '\x80', kStop = '.', kNone = 'N', kTrue = '\x88', kFalse = '\x89', kBinInt = 'J',
               kLong1 = '\x8a', kBinFloat = 'G', kBinUnicode = 'X', kEmptyList = ']', kEmptyDict = '}', kMark = '(',
               kAppends = 'e', kSetItems = 'u';

void little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void write_int(std::string& out, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out += kBinInt;
    little_endian(out, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    return;
  }
  // LONG1: the shortest little-endian two's complement.
  std::string bytes;
  little_endian(bytes, static_cast<uint64_t>(v), 8);
  while (bytes.size() > 1) {
    const auto last = static_cast<unsigned char>(bytes.back());
    const auto next = static_cast<unsigned char>(bytes[bytes.size() - 2]);
    if ((last == 0x00 && !(next & 0x80)) || (last == 0xff && (next & 0x80)))
      bytes.pop_back();
    else
      break;
  }
  out += kLong1;
  out += static_cast<char>(bytes.size());
  out += bytes;
}

void write(std::string& out, const nlohmann::ordered_json& v) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null:
      out += kNone;
      return;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? kTrue : kFalse;
      return;
    case nlohmann::ordered_json::value_t::number_integer:
      write_int(out, v.get<int64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_unsigned:
      write_int(out, static_cast<int64_t>(v.get<uint64_t>()));
      return;
    case nlohmann::ordered_json::value_t::number_float: {
      out += kBinFloat;
      const double d = v.get<double>();
      uint64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);  // big-endian
      return;
    }
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      out += kBinUnicode;
      little_endian(out, s.size(), 4);
      out += s;
      return;
    }
    case nlohmann::ordered_json::value_t::array:
      out += kEmptyList;
      if (v.empty()) return;
      out += kMark;
      for (const auto& item : v) write(out, item);
      out += kAppends;
      return;
    case nlohmann::ordered_json::value_t::object:
      out += kEmptyDict;
      if (v.empty()) return;
      out += kMark;
      for (const auto& [key, item] : v.items()) {
        write(out, key);
        write(out, item);
      }
      out += kSetItems;
      return;
    default:  // binary, discarded
      out += kNone;
  }
}

}  // namespace

std::string to_pickle(const nlohmann::ordered_json& value) {
  std::string out;
  out += kProto;
  out += '\x02';
  write(out, value);
  out += kStop;
  return out;
}

}  // namespace gclab::io
