# The optional backends. Each option is AUTO (the default: on when its dependency is
# found), ON (the dependency is required) or OFF. After this file each
# DTENSOR_WITH_<X> is a plain boolean.

set(DTENSOR_WITH_MPI AUTO CACHE STRING "Build the OpenMPI communication backend (AUTO, ON, OFF)")
set(DTENSOR_WITH_CUDA AUTO CACHE STRING "Build CUDA device support (AUTO, ON, OFF)")
set(DTENSOR_WITH_NCCL AUTO CACHE STRING "Build the NCCL communication backend (AUTO, ON, OFF)")

function(dtensor_resolve_option name found)
  set(value ${${name}})
  string(TOUPPER "${value}" value)
  if(value STREQUAL "AUTO")
    set(result ${found})
  elseif(value)
    if(NOT ${found})
      message(FATAL_ERROR "${name}=ON but its dependency was not found")
    endif()
    set(result ON)
  else()
    set(result OFF)
  endif()
  if(result)
    set(${name} ON PARENT_SCOPE)
  else()
    set(${name} OFF PARENT_SCOPE)
  endif()
endfunction()

# MPI
if(NOT DTENSOR_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
endif()
dtensor_resolve_option(DTENSOR_WITH_MPI MPI_CXX_FOUND)

# CUDA (the runtime library; CUDA kernels come with the CUDA backend issue)
if(NOT DTENSOR_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
endif()
dtensor_resolve_option(DTENSOR_WITH_CUDA CUDAToolkit_FOUND)

# NCCL ships with the CUDA toolkit here but has no CMake package of its own.
set(DTENSOR_NCCL_FOUND OFF)
if(DTENSOR_WITH_CUDA AND NOT DTENSOR_WITH_NCCL STREQUAL "OFF")
  find_path(DTENSOR_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(DTENSOR_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(DTENSOR_NCCL_INCLUDE_DIR AND DTENSOR_NCCL_LIBRARY)
    set(DTENSOR_NCCL_FOUND ON)
  endif()
endif()
dtensor_resolve_option(DTENSOR_WITH_NCCL DTENSOR_NCCL_FOUND)
