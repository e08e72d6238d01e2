// MPI error conversion for comm/ (internal header): MPI return codes become Status values naming
// the call, the MPI error string and the source line.
#pragma once
#include <mpi.h>

#include "base/status.h"

namespace tf::comm {

Status MpiError(int code, const char* expr, const char* file = nullptr, int line = 0);

}  // namespace tf::comm

#define TF_MPI_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                        \
    const int tf_mpi_rc_ = (expr);                                                            \
    if (tf_mpi_rc_ != MPI_SUCCESS) return ::tf::comm::MpiError(tf_mpi_rc_, #expr, __FILE__, __LINE__); \
  } while (0)
