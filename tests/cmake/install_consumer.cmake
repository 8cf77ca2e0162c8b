# ctest install_consumer (CMakeLists.txt block "issue 14: install and package"):
#   1. cmake --install BUILD_DIR into a fresh prefix WORK/prefix,
#   2. checks the layout (headers, liblattice.a, lattice-run, package config + version file),
#   3. configures examples/consumer against that prefix ONLY (CMAKE_PREFIX_PATH = the prefix; the
#      consumer checks that lattice_DIR and the include directory lie inside it, so a build that
#      still reached the source tree fails), builds it and runs it; the consumer checks its own
#      numbers (exit 1 on a wrong answer),
#   4. runs the installed lattice-run on the directory the consumer wrote (--help-free check that
#      the installed runner starts and reads a graph).
# What it proves: an outside project builds and links against the installed tree alone.
cmake_minimum_required(VERSION 3.24)
foreach(v BUILD_DIR SOURCE_DIR WORK GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consumer: -D${v}= missing")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK}/prefix)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --config ${CONFIG})

foreach(f include/lattice/lattice.h include/lattice/runtime.h include/lattice/ops/quantized.h
          lib/liblattice.a bin/lattice-run lib/cmake/lattice/latticeConfig.cmake
          lib/cmake/lattice/latticeConfigVersion.cmake lib/cmake/lattice/latticeTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    # GNUInstallDirs may pick lib64 on some hosts
    string(REPLACE "lib/" "lib64/" f64 ${f})
    if(NOT EXISTS ${prefix}/${f64})
      message(FATAL_ERROR "install_consumer: the installed tree lacks ${f}")
    endif()
  endif()
endforeach()
file(GLOB_RECURSE private_headers ${prefix}/include/*.cuh ${prefix}/include/backend/*)
if(private_headers)
  message(FATAL_ERROR "install_consumer: private headers were installed: ${private_headers}")
endif()

run("configure examples/consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK}/build
    -G ${GENERATOR} -DCMAKE_BUILD_TYPE=${CONFIG} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${prefix} -DLATTICE_EXPECT_PREFIX=${prefix})
run("build examples/consumer" ${CMAKE_COMMAND} --build ${WORK}/build --config ${CONFIG})
find_program(consumer lattice_consumer PATHS ${WORK}/build ${WORK}/build/${CONFIG} NO_DEFAULT_PATH)
if(NOT consumer)
  message(FATAL_ERROR "install_consumer: lattice_consumer was not built")
endif()
run("lattice_consumer" ${consumer} ${WORK}/net)
message("${LAST_OUT}")
if(NOT LAST_OUT MATCHES "lattice_consumer: all checks passed")
  message(FATAL_ERROR "install_consumer: the consumer did not report success")
endif()

# The installed runner on the directory the consumer wrote: its labels must be the hand-computed ones.
find_program(runner lattice-run PATHS ${prefix}/bin NO_DEFAULT_PATH)
if(NOT runner)
  message(FATAL_ERROR "install_consumer: ${prefix}/bin/lattice-run missing")
endif()
run("installed lattice-run" ${runner} ${WORK}/net ${WORK}/net/scan.bin --out ${WORK}/net/runner.label)
message("${LAST_OUT}")
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/net/runner.label ${WORK}/net/expected.label
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "install_consumer: the installed lattice-run's labels differ from expected.label")
endif()
message("install_consumer: installed tree OK (headers, liblattice.a, package config, lattice-run)")
