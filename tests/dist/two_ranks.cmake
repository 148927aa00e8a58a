# Runs the process-group test as two ranks on loopback, as torchrun would start them, and fails unless both pass.
# -DEXE=<test binary> -DPORT=<a free port>
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env GCLAB_DIST_TWO_RANKS=1 WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${PORT}
          ${EXE} --gtest_filter=ProcessGroup.TwoRanks*:GradientReducer.*
  COMMAND ${CMAKE_COMMAND} -E env GCLAB_DIST_TWO_RANKS=1 WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=${PORT}
          ${EXE} --gtest_filter=ProcessGroup.TwoRanks*:GradientReducer.*
  RESULTS_VARIABLE results OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
message("${out}")
foreach(r IN LISTS results)
  if(NOT r EQUAL 0)
    message(FATAL_ERROR "a rank failed: ${results}")
  endif()
endforeach()
