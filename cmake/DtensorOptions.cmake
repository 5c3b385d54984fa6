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

# The optional GEMM engines of the CPU backend (OpenBLAS is always there). Plain
# find_path/find_library: Debian's dnnl CMake package drags in OpenCL, and BLIS has
# no CMake or pkg-config file; its headers sit in one folder per threading flavour.
set(DTENSOR_WITH_ONEDNN AUTO CACHE STRING "Build the oneDNN GEMM engine (AUTO, ON, OFF)")
set(DTENSOR_WITH_BLIS AUTO CACHE STRING "Build the BLIS GEMM engine (AUTO, ON, OFF)")
set(DTENSOR_ONEDNN_FOUND OFF)
if(NOT DTENSOR_WITH_ONEDNN STREQUAL "OFF")
  find_path(DTENSOR_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(DTENSOR_ONEDNN_LIBRARY dnnl)
  find_package(OpenMP QUIET COMPONENTS CXX)  # Debian's oneDNN runs on OpenMP
  if(DTENSOR_ONEDNN_INCLUDE_DIR AND DTENSOR_ONEDNN_LIBRARY AND OpenMP_CXX_FOUND)
    set(DTENSOR_ONEDNN_FOUND ON)
  endif()
endif()
dtensor_resolve_option(DTENSOR_WITH_ONEDNN DTENSOR_ONEDNN_FOUND)
set(DTENSOR_BLIS_FOUND OFF)
if(NOT DTENSOR_WITH_BLIS STREQUAL "OFF")
  set(blis_flavours blis-openmp blis-pthread blis-serial blis)
  find_path(DTENSOR_BLIS_INCLUDE_DIR blis.h PATH_SUFFIXES ${blis_flavours} PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
  find_library(DTENSOR_BLIS_LIBRARY blis PATH_SUFFIXES ${blis_flavours})
  if(DTENSOR_BLIS_INCLUDE_DIR AND DTENSOR_BLIS_LIBRARY)
    set(DTENSOR_BLIS_FOUND ON)
  endif()
endif()
dtensor_resolve_option(DTENSOR_WITH_BLIS DTENSOR_BLIS_FOUND)
