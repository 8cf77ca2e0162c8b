// LZF decompression (the byte format of liblzf, used by PCD's binary_compressed), written from
// the format description:
//   control byte c < 32:  a literal run, the next c + 1 bytes are copied;
//   otherwise:            a back reference, length field L = c >> 5 (L == 7: add the next byte),
//                         distance = ((c & 31) << 8 | next byte) + 1, copy L + 2 bytes from
//                         `distance` bytes back in the output (ranges may overlap: runs).
// Every step is bounded by the input and the output sizes.
#include "common.h"

namespace lattice::io::detail {

void lzf_decompress(std::span<const std::byte> in, std::span<std::byte> out, const Source& src) {
  const std::uint64_t in_size = in.size();
  const std::uint64_t out_size = out.size();
  const std::string expected = "LZF data that decompresses to " + plural(out_size, "byte");
  std::uint64_t ip = 0;
  std::uint64_t op = 0;
  const auto byte_at = [&](std::uint64_t i) { return static_cast<unsigned>(in[i]); };
  while (ip < in_size) {
    const std::uint64_t at = ip;
    const unsigned ctrl = byte_at(ip++);
    if (ctrl < 32) {
      const std::uint64_t len = ctrl + 1u;
      if (len > in_size - ip)
        src.fail(expected, "a literal run of " + plural(len, "byte") +
                               " cut off at compressed offset " + std::to_string(at));
      if (len > out_size - op)
        src.fail(expected,
                 "more output (a literal run at compressed offset " + std::to_string(at) + ")");
      std::memcpy(out.data() + op, in.data() + ip, static_cast<std::size_t>(len));
      ip += len;
      op += len;
      continue;
    }
    std::uint64_t len = ctrl >> 5;
    if (len == 7) {
      if (ip >= in_size)
        src.fail(expected, "a back reference cut off at compressed offset " + std::to_string(at));
      len += byte_at(ip++);
    }
    if (ip >= in_size)
      src.fail(expected, "a back reference cut off at compressed offset " + std::to_string(at));
    const std::uint64_t distance =
        ((static_cast<std::uint64_t>(ctrl & 31u) << 8) | byte_at(ip++)) + 1;
    len += 2;
    if (distance > op)
      src.fail(expected, "a back reference " + std::to_string(distance) +
                             " bytes back at output offset " + std::to_string(op) +
                             " (before the start)");
    if (len > out_size - op)
      src.fail(expected,
               "more output (a back reference at compressed offset " + std::to_string(at) + ")");
    std::byte* dst = out.data() + op;
    const std::byte* from = dst - distance;
    for (std::uint64_t k = 0; k < len; ++k) dst[k] = from[k];  // byte by byte: overlap repeats
    op += len;
  }
  if (op != out_size) src.fail(expected, plural(op, "byte"));
}

}  // namespace lattice::io::detail
