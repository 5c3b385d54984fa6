// How the examples read their command lines with CLI11: the same --help and the same
// one-line errors in every program.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dtensor::tools {

// Parses `argv` into the options of `app`. --help prints the help and gives false; a
// CLI11 parse error (unknown flag, wrong type, value outside its choices) throws
// std::invalid_argument with CLI11's message and " (see --help)".
inline bool parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }
  return true;
}

}  // namespace dtensor::tools
