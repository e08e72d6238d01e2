// trainflow: command-line entry point (placeholder until the CLI lands in engine/cli.cpp).
#include <cstdio>
int main() {
  std::puts("trainflow: CLI not yet wired");
  return 0;
}
