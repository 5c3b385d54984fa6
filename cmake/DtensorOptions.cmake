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
    set(result ${${found}})
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
# The kernels (src/backend/cuda/*.cu) compile for DTENSOR_CUDA_ARCHITECTURES (CMake's
# CUDA_ARCHITECTURES syntax: "90", "80;90", "90-real"); CMAKE_CUDA_ARCHITECTURES,
# when given, wins. One architecture by default keeps CI's compile time down; the
# H100/H200 generation is the target (an A100 build needs -DDTENSOR_CUDA_ARCHITECTURES="80;90").
if(DTENSOR_WITH_CUDA)
  set(DTENSOR_CUDA_ARCHITECTURES "90" CACHE STRING "GPU architectures of the CUDA kernels")
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${DTENSOR_CUDA_ARCHITECTURES})
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  # The library links the shared runtime (CUDA::cudart); kernels must use the same one.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # The kernels are C++20 like the rest (CUDA_STANDARD follows CXX_STANDARD); CMake
  # 3.25 does not know nvcc's flag for it (nvcc 12+ takes -std=c++20).
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
endif()

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

# cuDNN 9 (the CUDA backend's fused attention, src/backend/cudnn/) ships with the
# toolkit here too; without it the own attention kernels run every call.
set(DTENSOR_WITH_CUDNN AUTO CACHE STRING "Build cuDNN's fused attention into the CUDA backend (AUTO, ON, OFF)")
set(DTENSOR_CUDNN_FOUND OFF)
if(DTENSOR_WITH_CUDA AND NOT DTENSOR_WITH_CUDNN STREQUAL "OFF")
  find_path(DTENSOR_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(DTENSOR_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(DTENSOR_CUDNN_INCLUDE_DIR AND DTENSOR_CUDNN_LIBRARY)
    file(STRINGS ${DTENSOR_CUDNN_INCLUDE_DIR}/cudnn_version.h cudnn_version_lines REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1.\\2.\\3"
           DTENSOR_CUDNN_VERSION "${cudnn_version_lines}")
    # The backend API's graph of fused attention as built here needs cuDNN 9.
    if(DTENSOR_CUDNN_VERSION VERSION_GREATER_EQUAL 9)
      set(DTENSOR_CUDNN_FOUND ON)
    endif()
  endif()
endif()
dtensor_resolve_option(DTENSOR_WITH_CUDNN DTENSOR_CUDNN_FOUND)

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
