# ctest kernel_registry_generator: cmake/kernel_registry.cmake (the step that turns the kernel
# files' LATTICE_ROUTE_KERNELS registrations into the kernel table's list) on fixture sources:
# it lists exactly the registrations that start a line (a multi-line one, a one-line one ending
# in `;`), ignores the macro's definition, comments and indented mentions, writes the paths
# relative to the source root, and stops with the file's name on a registration it cannot read
# and on a route registered twice.
cmake_minimum_required(VERSION 3.24)
foreach(var GENERATOR WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "kernel_registry_check: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/src/backend/cpu/conv ${WORK}/src/backend/cpu/pool)

function(run_generator sources out_var rc_var err_var)
  string(REPLACE ";" "\n" lines "${sources}")
  file(WRITE ${WORK}/sources.txt "${lines}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${WORK} -DSOURCES_FILE=${WORK}/sources.txt
                          -DOUTPUT=${WORK}/out/kernel_registry.inc -P ${GENERATOR}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
  if(EXISTS ${WORK}/out/kernel_registry.inc)
    file(READ ${WORK}/out/kernel_registry.inc text)
    set(${out_var} "${text}" PARENT_SCOPE)
  else()
    set(${out_var} "" PARENT_SCOPE)
  endif()
endfunction()

set(a ${WORK}/src/backend/cpu/conv/a.cpp)
set(b ${WORK}/src/backend/cpu/pool/b.cpp)
file(WRITE ${a} [=[
// Constraints: fixture.
#define LATTICE_ROUTE_KERNELS(Kernels, route, ...) nothing
// LATTICE_ROUTE_KERNELS(ConvKernels, conv_in_a_comment, {});
  LATTICE_ROUTE_KERNELS(ConvKernels, conv_indented, {});
namespace lattice::backend::cpu { void f(const ConvArgs&) {} }

LATTICE_ROUTE_KERNELS(ConvKernels, conv_fixture, {
    .forward = cpu::f,
    .bias_grad = cpu::f});
]=])
file(WRITE ${b} [=[
LATTICE_ROUTE_KERNELS(PoolEdgeKernels, pool_edges_fixture, {.batch_edges = cpu::g});
]=])
run_generator("${b};${a}" out rc err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kernel_registry_check: the generator failed on good sources:\n${err}")
endif()
string(REGEX MATCHALL "LATTICE_REGISTERED\\([^\n]*" found "${out}")
set(expected
  [[LATTICE_REGISTERED(ConvKernels, conv_fixture, "src/backend/cpu/conv/a.cpp")]]
  [[LATTICE_REGISTERED(PoolEdgeKernels, pool_edges_fixture, "src/backend/cpu/pool/b.cpp")]])
if(NOT "${found}" STREQUAL "${expected}")
  message(FATAL_ERROR "kernel_registry_check: expected\n  ${expected}\ngot\n  ${found}\n(file:\n${out})")
endif()
if(NOT out MATCHES "\\(2 routes\\)")
  message(FATAL_ERROR "kernel_registry_check: the header does not count 2 routes:\n${out}")
endif()

# A registration whose route is not on its first line cannot be read: the build stops, naming it.
file(WRITE ${b} "LATTICE_ROUTE_KERNELS(PoolEdgeKernels,\n    pool_edges_fixture, {});\n")
run_generator("${a};${b}" out rc err)
if(rc EQUAL 0 OR NOT err MATCHES "src/backend/cpu/pool/b.cpp: a registration needs")
  message(FATAL_ERROR "kernel_registry_check: an unreadable registration passed (rc ${rc}):\n${err}")
endif()

# The same route registered in two files: the build stops, naming both.
file(WRITE ${b} "LATTICE_ROUTE_KERNELS(ConvKernels, conv_fixture, {});\n")
run_generator("${a};${b}" out rc err)
if(rc EQUAL 0 OR NOT err MATCHES "conv_fixture is registered twice" OR NOT err MATCHES "a.cpp" OR NOT err MATCHES "b.cpp")
  message(FATAL_ERROR "kernel_registry_check: a duplicate registration passed (rc ${rc}):\n${err}")
endif()
message(STATUS "kernel_registry_check: the generator lists, ignores and rejects as required")
