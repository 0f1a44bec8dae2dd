# inferlab_add_test(<name> SOURCES...): a GoogleTest executable linked with the core and the
# shared test helpers (tests/test_util.h: fresh random inputs, derived tolerances, temp dirs),
# registered with CTest test by test. Chapters add their golden and two-path tests with it.
function(inferlab_add_test name)
  if(NOT INFERLAB_TESTS)
    return()
  endif()
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE inferlab_test_main)
  # ctest runs two tests at a time on the 2-core CI machine: one OpenMP thread each, waiting
  # passively, so that teams never fight for cores. Tests that exercise the threaded paths ask
  # for their threads themselves (test::ThreadCount).
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "unit" ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endfunction()
