# Running the gclab executable the way a user does, for the CLI tests (cmake -P scripts).

# Runs the command; fails unless it exits with expected_rc. Leaves stdout / stderr in last_out / last_err.
function(expect_run expected_rc)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "`${ARGN}` exited ${rc}, expected ${expected_rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
  set(last_err "${err}" PARENT_SCOPE)
endfunction()

function(expect_contains text needle)
  string(FIND "${text}" "${needle}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "expected to find '${needle}' in:\n${text}")
  endif()
endfunction()
