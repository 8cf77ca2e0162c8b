# ctest layer_view_*: proves the build enforces the layer direction (CMakeLists.txt, lattice_view).
# Compiles, with only the include folder of one layer's view (-DVIEW), a source that includes
# -DHEADER, a header that layer must not reach: that compile must fail with "No such file".
# A control source that includes the layer's own vocabulary instead must compile with the same
# command, so the failure comes from the forbidden include and not from the harness.
foreach(var CXX VIEW HEADER WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "layer_check: -D${var}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/bad.cpp "#include \"${HEADER}\"\nint main() { return 0; }\n")
file(WRITE ${WORK}/good.cpp "#include \"lattice/core/array.h\"\nint main() { return 0; }\n")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${VIEW} ${WORK}/good.cpp
                RESULT_VARIABLE good_rc ERROR_VARIABLE good_err)
if(NOT good_rc EQUAL 0)
  message(FATAL_ERROR "layer_check: the control source does not compile against ${VIEW}:\n${good_err}")
endif()
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${VIEW} ${WORK}/bad.cpp
                RESULT_VARIABLE bad_rc ERROR_VARIABLE bad_err)
if(bad_rc EQUAL 0)
  message(FATAL_ERROR "layer_check: ${HEADER} compiled against ${VIEW}; the layer can include it")
endif()
if(NOT bad_err MATCHES "No such file")
  message(FATAL_ERROR "layer_check: ${HEADER} failed for another reason than a missing header:\n${bad_err}")
endif()
message(STATUS "layer_check: ${HEADER} is out of reach of ${VIEW} (as required)")
