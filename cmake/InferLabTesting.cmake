# inferlab_add_test(<name> <sources>... [LIBS <libraries>...]): a GoogleTest executable linked
# with the core, the shared test helpers (tests/test_util.h: fresh random inputs, derived
# tolerances, temp dirs) and LIBS, registered with CTest test by test. Chapters add their golden
# and two-path tests with it. Nothing is built when INFERLAB_TESTS is off.
function(inferlab_add_test name)
  if(NOT INFERLAB_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "" "LIBS" ${ARGN})
  add_executable(${name} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE inferlab_test_main ${T_LIBS})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 NO_PRETTY_VALUES)  # names as gtest prints them
  # The tests' properties, set once the discovered tests exist (gtest_discover_tests' own
  # PROPERTIES would split these list values). ctest runs two tests at a time on the 2-core CI
  # machine: one OpenMP thread each, waiting passively, so that teams never fight for cores.
  # Tests that exercise the threaded paths ask for their threads themselves (test::ThreadCount).
  # The tests that need a lab exercise's code (tests/lab_tests.txt, docs/labs.md) also get the
  # labels "lab" and "ex<id>".
  set(script "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS unit\n    ENVIRONMENT \"OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE\")\nendif()\n")
  set(lab_tests "${PROJECT_SOURCE_DIR}/tests/lab_tests.txt")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${lab_tests}")
  file(STRINGS "${lab_tests}" lab_lines REGEX "^${name} ")
  foreach(line IN LISTS lab_lines)
    string(REGEX MATCH "^[^ ]+ ([0-9.]+) (.+)$" _ "${line}")
    string(APPEND script "set_tests_properties([==[${CMAKE_MATCH_2}]==] PROPERTIES LABELS \"unit;lab;ex${CMAKE_MATCH_1}\")\n")
  endforeach()
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake" "${script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake")
endfunction()

# inferlab_add_bench(<name> <source> LIBS <libraries>...): a Google Benchmark program from
# tests/bench/, built when INFERLAB_BENCHMARKS is on.
function(inferlab_add_bench name source)
  if(NOT INFERLAB_BENCHMARKS)
    return()
  endif()
  cmake_parse_arguments(B "" "" "LIBS" ${ARGN})
  add_executable(${name} "${PROJECT_SOURCE_DIR}/tests/bench/${source}")
  target_link_libraries(${name} PRIVATE ${B_LIBS} benchmark::benchmark)
endfunction()

# inferlab_cuda_sources(<target> <cuda source> <stub source>): the chapter's CUDA code where nvcc
# was found, else a stub whose calls say that this build has no CUDA backend.
function(inferlab_cuda_sources target cuda stub)
  if(INFERLAB_HAVE_CUDA)
    target_sources(${target} PRIVATE ${cuda})
  else()
    target_sources(${target} PRIVATE ${stub})
  endif()
endfunction()
