// trainflow: the single binary. Only main() turns errors into exit codes (see engine/cli.h).
#include "comm/process_group.h"
#include "engine/cli.h"

#include <cstdio>
#include <exception>
#include <new>

int main(int argc, char** argv) {
  // Library code reports errors as Status; this is the last line of defence against an exception
  // escaping from a dependency (e.g. allocation failure in a standard container).
  int rc = 1;
  try {
    rc = tf::RunCli(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "trainflow: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainflow: error: %s\n", e.what());
  }
  // A rank that fails alone in a data-parallel job must take the job down: its peers may be
  // waiting in a collective it will never join (MPI_Finalize would wait for them in turn).
  if (rc != 0) tf::comm::AbortProcessGroupOnError(rc);
  return rc;
}
