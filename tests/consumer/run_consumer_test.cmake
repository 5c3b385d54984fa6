# Installs dtensor into a scratch prefix, then configures, builds and runs
# tests/consumer against it twice: with find_package(dtensor CONFIG), and with
# pkg-config's flags on a plain compiler command line.
#   BUILD_DIR   the dtensor build to install; or, with OTHER_KIND, the source tree
#               of a library-only build of the other kind (static when this build is
#               shared, and the reverse) configured like this one (OPTIONS).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
set(build ${BUILD_DIR})
if(OTHER_KIND)
  set(build ${WORK_DIR}/dtensor-build)
  string(REPLACE "|" ";" options "${OPTIONS}")
  run(${CMAKE_COMMAND} -S ${SOURCE_ROOT} -B ${build} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
      -DDTENSOR_BUILD_TESTS=OFF -DDTENSOR_BUILD_BENCHMARKS=OFF -DDTENSOR_BUILD_EXAMPLES=OFF ${options})
  run(${CMAKE_COMMAND} --build ${build} -j 2)
endif()
run(${CMAKE_COMMAND} --install ${build} --prefix ${prefix})
file(GLOB static_archive ${prefix}/lib*/libdtensor.a)
file(GLOB shared_library ${prefix}/lib*/libdtensor.so)
message(STATUS "installed: ${static_archive}${shared_library}")

# The installed headers define no macro outside DTENSOR_ for users' code, except
# dlpack_abi.h, which defines DLPack's own macros exactly as <dlpack/dlpack.h> does.
file(GLOB_RECURSE headers ${prefix}/include/dtensor/*.h)
foreach(header ${headers})
  set(allowed "DTENSOR_")
  if(header MATCHES "/dlpack_abi\\.h$")
    set(allowed "(DTENSOR|DLPACK)_")
  endif()
  file(STRINGS ${header} defines REGEX "^[ \t]*#[ \t]*define[ \t]+")
  foreach(line ${defines})
    if(NOT line MATCHES "^[ \t]*#[ \t]*define[ \t]+${allowed}")
      message(FATAL_ERROR "${header} defines a macro without the DTENSOR_ prefix: ${line}")
    endif()
  endforeach()
endforeach()

# find_package(dtensor CONFIG)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
message(STATUS "find_package: ${run_output}")

# pkg-config
file(GLOB pc_dir ${prefix}/lib*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
set(pc_args --cflags --libs)
if(static_archive)
  list(APPEND pc_args --static)
endif()
run(pkg-config ${pc_args} dtensor)
string(STRIP "${run_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
# The README's command as it stands: the .pc's Libs carry the rpath of a shared install.
run(${CXX} -std=c++20 ${SOURCE_DIR}/main.cpp -o ${WORK_DIR}/consumer_pkgconfig ${flags})
run(${WORK_DIR}/consumer_pkgconfig)
message(STATUS "pkg-config: ${run_output}")
