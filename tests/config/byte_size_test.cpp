#include <gtest/gtest.h>

#include "gclab/config/byte_size.h"

namespace gclab::config {
namespace {

TEST(ByteSize, BinaryAndDecimalUnits) {
  EXPECT_EQ(parse_byte_size("24GiB"), 24LL << 30);
  EXPECT_EQ(parse_byte_size("24 gib"), 24LL << 30);
  EXPECT_EQ(parse_byte_size("24GB"), 24000000000LL);
  EXPECT_EQ(parse_byte_size("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3LL << 29);
  EXPECT_EQ(parse_byte_size("12345"), 12345);
  EXPECT_EQ(parse_byte_size("0"), 0);
}

TEST(ByteSize, RejectsWhatIsNotASize) {
  EXPECT_EQ(parse_byte_size(""), std::nullopt);
  EXPECT_EQ(parse_byte_size("-1GiB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("24 parsecs"), std::nullopt);
  EXPECT_EQ(parse_byte_size("GiB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("1e300GiB"), std::nullopt);
}

TEST(ByteSize, FormatsForPeopleAndForFiles) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3LL << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes_exact(24LL << 30), "24GiB");
  EXPECT_EQ(format_bytes_exact(1000), "1000");
  EXPECT_EQ(parse_byte_size(format_bytes_exact(24LL << 30)), 24LL << 30);
}

}  // namespace
}  // namespace gclab::config
