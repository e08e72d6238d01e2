// cu_to_cpp IN.cu OUT.cpp: rewrites a CUDA source file into C++ for the cuemu emulator (cuemu.h).
//   kernel<<<grid, block[, smem[, stream]]>>>(args)  ->  ::cuemu::Launch(grid, block, ...).Run(kernel)(args)
//   extern __shared__ [__align__(N)] T name[];       ->  T* name = static_cast<T*>(::cuemu::DynamicShared());
// Everything else is left to the preprocessor (cuemu.h). Line numbers are preserved and a #line
// directive names the original file, so compiler errors and assertions point at the .cu source.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

bool IsIdent(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }

// Rewrites every `<<<...>>>` launch; returns false with a message on malformed input.
bool RewriteLaunches(std::string& s, std::string& error) {
  size_t pos = 0;
  while ((pos = s.find("<<<", pos)) != std::string::npos) {
    const size_t close = s.find(">>>", pos + 3);
    if (close == std::string::npos) {
      error = "unterminated <<< at offset " + std::to_string(pos);
      return false;
    }
    // The kernel expression before <<<: an identifier, optionally with template arguments.
    long k = static_cast<long>(pos) - 1;
    while (k >= 0 && std::isspace(static_cast<unsigned char>(s[k]))) --k;
    if (k >= 0 && s[k] == '>') {
      int depth = 0;
      for (; k >= 0; --k) {
        if (s[k] == '>') ++depth;
        if (s[k] == '<' && --depth == 0) break;
      }
      --k;
    }
    while (k >= 0 && IsIdent(s[k])) --k;
    const size_t start = static_cast<size_t>(k + 1);
    std::string kernel = s.substr(start, pos - start);
    const std::string config = s.substr(pos + 3, close - pos - 3);
    // Keep the newlines of the replaced text so line numbers stay right.
    std::string newlines;
    for (char c : kernel + config)
      if (c == '\n') newlines += '\n';
    std::string flat_kernel;
    for (char c : kernel)
      if (c != '\n') flat_kernel += c;
    std::string flat_config;
    for (char c : config) flat_config += (c == '\n' ? ' ' : c);
    const std::string replacement = "::cuemu::Launch(" + flat_config + ").Run(" + flat_kernel + ")" + newlines;
    s.replace(start, close + 3 - start, replacement);
    pos = start + replacement.size();
  }
  return true;
}

std::string RewriteDynamicShared(const std::string& s) {
  static const std::regex re(R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;)");
  return std::regex_replace(s, re, "$1* $2 = static_cast<$1*>(::cuemu::DynamicShared());");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: cu_to_cpp IN.cu OUT.cpp\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::cerr << "cu_to_cpp: cannot read " << argv[1] << "\n";
    return 1;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string s = buf.str();
  std::string error;
  if (!RewriteLaunches(s, error)) {
    std::cerr << "cu_to_cpp: " << argv[1] << ": " << error << "\n";
    return 1;
  }
  s = RewriteDynamicShared(s);
  const std::string out_text = "#include \"tests/emulator/cuemu.h\"\n#line 1 \"" + std::string(argv[1]) + "\"\n" + s;
  // Write only when changed, so dependent objects are not rebuilt needlessly.
  {
    std::ifstream old(argv[2], std::ios::binary);
    if (old) {
      std::stringstream ob;
      ob << old.rdbuf();
      if (ob.str() == out_text) return 0;
    }
  }
  std::ofstream out(argv[2], std::ios::binary);
  out << out_text;
  if (!out) {
    std::cerr << "cu_to_cpp: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}
