// trainflow: the single binary. Only main() turns errors into exit codes (see engine/cli.h).
#include "engine/cli.h"

#include <cstdio>
#include <exception>
#include <new>

int main(int argc, char** argv) {
  // Library code reports errors as Status; this is the last line of defence against an exception
  // escaping from a dependency (e.g. allocation failure in a standard container).
  try {
    return tf::RunCli(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "trainflow: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainflow: error: %s\n", e.what());
  }
  return 1;
}
