#include "lattice/core/error.h"

#include <sstream>

namespace lattice {

std::string format_error(std::string_view op, std::string_view arg, std::string_view expected,
                         std::string_view got) {
  std::string s;
  s.reserve(op.size() + arg.size() + expected.size() + got.size() + 24);
  s.append("[").append(op).append("] ").append(arg).append(": expected ").append(expected);
  s.append(", got ").append(got);
  return s;
}

void throw_value_error(std::string_view op, std::string_view arg, std::string_view expected,
                       std::string_view got) {
  throw ValueError(format_error(op, arg, expected, got));
}

void throw_type_error(std::string_view op, std::string_view arg, std::string_view expected,
                      std::string_view got) {
  throw TypeError(format_error(op, arg, expected, got));
}

void throw_internal(const char* file, int line, std::string_view what) {
  std::ostringstream s;
  s << "lattice internal error at " << file << ":" << line << ": " << what
    << " (this is a bug in lattice; please report it)";
  throw InternalError(s.str());
}

std::string format_shape(std::span<const std::int64_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace lattice
