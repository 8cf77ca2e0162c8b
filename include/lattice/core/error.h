// Error kinds (DESIGN.md "Errors"): the semantic layer raises ValueError / TypeError with one
// message format, `[op] argument: expected ..., got ...`; the route layer never throws, the
// semantic layer turns "no admitted route" into UnsupportedError carrying the explain table;
// InternalError marks a broken invariant inside lattice (a bug, never bad input).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lattice {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ValueError : public Error {
 public:
  using Error::Error;
};
class TypeError : public Error {
 public:
  using Error::Error;
};
class UnsupportedError : public Error {
 public:
  using Error::Error;
};
class InternalError : public Error {
 public:
  using Error::Error;
};

// "[op] arg: expected <expected>, got <got>"
std::string format_error(std::string_view op, std::string_view arg, std::string_view expected,
                         std::string_view got);
[[noreturn]] void throw_value_error(std::string_view op, std::string_view arg,
                                    std::string_view expected, std::string_view got);
[[noreturn]] void throw_type_error(std::string_view op, std::string_view arg,
                                   std::string_view expected, std::string_view got);
[[noreturn]] void throw_internal(const char* file, int line, std::string_view what);

// "(64, 3, 3, 3, 16)"
std::string format_shape(std::span<const std::int64_t> shape);

}  // namespace lattice

// Internal invariant check (not for validating user input).
#define LATTICE_ASSERT(cond, what)                                     \
  do {                                                                 \
    if (!(cond)) ::lattice::throw_internal(__FILE__, __LINE__, (what)); \
  } while (0)
