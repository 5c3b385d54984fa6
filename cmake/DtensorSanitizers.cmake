# DTENSOR_SANITIZE: sanitizers for everything this project builds (library, tests,
# examples, benchmarks, fuzzers): "address;undefined" or "thread" (.ci/run builds
# both). Undefined behaviour stops the program (a report must fail its test).
# DTENSOR_BUILD_FUZZERS: the libFuzzer targets of tests/fuzz (Clang only); the
# library is then built with -fsanitize=fuzzer-no-link for coverage.
set(DTENSOR_SANITIZE "" CACHE STRING "Sanitizers to build with: address;undefined, or thread")
option(DTENSOR_BUILD_FUZZERS "Build the libFuzzer targets (needs Clang)" OFF)

if(DTENSOR_SANITIZE)
  if("thread" IN_LIST DTENSOR_SANITIZE AND "address" IN_LIST DTENSOR_SANITIZE)
    message(FATAL_ERROR "DTENSOR_SANITIZE: thread and address cannot be combined")
  endif()
  list(JOIN DTENSOR_SANITIZE "," dtensor_sanitizers)
  add_compile_options(-fsanitize=${dtensor_sanitizers} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${dtensor_sanitizers})
  if("undefined" IN_LIST DTENSOR_SANITIZE)
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

if(DTENSOR_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DTENSOR_BUILD_FUZZERS needs Clang (libFuzzer), got ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
