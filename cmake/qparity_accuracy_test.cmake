# One accuracy test of qparity_add_accuracy_tests (qparityAccuracyTests.cmake), run by ctest as
# `cmake -DQ_ARGS=<args file> -P qparity_accuracy_test.cmake`. Steps, each printed:
#   1. the scheme's checkpoint: MODEL itself for bf16, else `qparity quantize` of it
#   2. the tokens: SEQUENCES x SEQ_LEN ids (one sequence per line) from TOKENS, or TEXT through
#      the checkpoint's tokenizer
#   3. the user's candidate command, placeholders substituted
#   4. `qparity validate --model <checkpoint> --candidate <dump>`: its row in <out>, junit.xml
#   5. on FAIL `qparity bisect <golden> <dump> --model <checkpoint>` into <out>/bisect.txt
# The work directory and the report directory belong to the test and are made anew each run.
cmake_minimum_required(VERSION 3.25)
include("${Q_ARGS}")

function(step title)
  message("qparity-accuracy: ${Q_NAME}: ${title}")
endfunction()

# Runs a command, echoing it; the exit status lands in ${rc_var}, output goes to the log as is.
function(run rc_var)
  list(JOIN ARGN " " shown)
  message("qparity-accuracy: $ ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

function(fail why)
  message(FATAL_ERROR "qparity-accuracy: ${Q_NAME}: ${why}")
endfunction()

# A GPU device key on a machine without an NVIDIA GPU: skipped, with the reason.
if(Q_DEVICE MATCHES "^sm[0-9]+")
  find_program(nvidia_smi nvidia-smi)
  set(gpu_rc 1)
  if(nvidia_smi)
    execute_process(COMMAND "${nvidia_smi}" -L RESULT_VARIABLE gpu_rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(NOT gpu_rc EQUAL 0)
    message("qparity-accuracy: SKIPPED: ${Q_NAME} needs a GPU (device ${Q_DEVICE}); nvidia-smi -L finds none")
    return()
  endif()
endif()

file(REMOVE_RECURSE "${Q_WORK}" "${Q_OUT}")
file(MAKE_DIRECTORY "${Q_WORK}" "${Q_OUT}")

# 1. The checkpoint the candidate must run.
get_filename_component(model_name "${Q_MODEL}" NAME)
if(Q_SCHEME STREQUAL "bf16")
  set(checkpoint "${Q_MODEL}")
else()
  step("quantize ${model_name} into ${Q_SCHEME} (dialect ${Q_DIALECT})")
  set(checkpoint "${Q_WORK}/${model_name}-${Q_SCHEME}")
  run(rc "${Q_QPARITY}" quantize --in "${Q_MODEL}" --scheme "${Q_SCHEME}" --dialect "${Q_DIALECT}"
      --out "${checkpoint}")
  if(NOT rc EQUAL 0)
    fail("qparity quantize exited ${rc}")
  endif()
endif()

# 2. The tokens, SEQUENCES lines of SEQ_LEN ids.
if(Q_TEXT)
  step("tokenize ${Q_TEXT}")
  # The unquantized checkpoint's tokenizer: a quantized copy need not carry one.
  run(rc "${Q_QPARITY}" tokenize --model "${Q_MODEL}" --text "${Q_TEXT}" --out "${Q_WORK}/all-tokens.txt")
  if(NOT rc EQUAL 0)
    fail("qparity tokenize exited ${rc}")
  endif()
  set(source "${Q_WORK}/all-tokens.txt")
else()
  set(source "${Q_TOKENS}")
endif()
file(READ "${source}" ids)
string(REGEX MATCHALL "[0-9]+" ids "${ids}")
list(LENGTH ids have)
math(EXPR need "${Q_SEQUENCES} * ${Q_SEQ_LEN}")
if(have LESS need)
  fail("${source} holds ${have} token ids; ${Q_SEQUENCES} x ${Q_SEQ_LEN} = ${need} are needed")
endif()
set(lines "")
math(EXPR last_seq "${Q_SEQUENCES} - 1")
foreach(s RANGE ${last_seq})
  math(EXPR first "${s} * ${Q_SEQ_LEN}")
  list(SUBLIST ids ${first} ${Q_SEQ_LEN} seq)
  list(JOIN seq " " seq)
  string(APPEND lines "${seq}\n")
endforeach()
set(tokens "${Q_WORK}/tokens.txt")
file(WRITE "${tokens}" "${lines}")

# 3. The engine.
set(candidate "${Q_WORK}/candidate.h5")
set(command "")
foreach(word IN LISTS Q_COMMAND)
  string(REPLACE "@MODEL@" "${checkpoint}" word "${word}")
  string(REPLACE "@TOKENS@" "${tokens}" word "${word}")
  string(REPLACE "@SEQUENCES@" "${Q_SEQUENCES}" word "${word}")
  string(REPLACE "@SEQ_LEN@" "${Q_SEQ_LEN}" word "${word}")
  string(REPLACE "@CANDIDATE@" "${candidate}" word "${word}")
  string(REPLACE "@SCHEME@" "${Q_SCHEME}" word "${word}")
  string(REPLACE "@WORK@" "${Q_WORK}" word "${word}")
  list(APPEND command "${word}")
endforeach()
step("the candidate command")
run(rc ${command})
if(NOT rc EQUAL 0)
  fail("the candidate command exited ${rc}")
endif()
if(NOT EXISTS "${candidate}")
  fail("the candidate command exited 0 but wrote no ${candidate}")
endif()

# 4. The engine row.
set(policy_args "")
if(Q_POLICIES)
  set(policy_args --policies "${Q_POLICIES}")
endif()
step("validate the candidate against the reference")
run(rc "${Q_QPARITY}" validate --model "${checkpoint}" --candidate "${candidate}" --out "${Q_OUT}"
    --junit "${Q_OUT}/junit.xml" --keep-work ${policy_args})
if(rc EQUAL 0)
  set(verdict PASS)
elseif(rc EQUAL 3)
  set(verdict FAIL)
else()
  fail("qparity validate exited ${rc} (an error, not a verdict)")
endif()
# Exit 0 is also NOT JUDGED (no policy gate applies): read the row's own verdict.
file(READ "${Q_OUT}/junit.xml" junit)
if(verdict STREQUAL "PASS" AND junit MATCHES "<skipped")
  fail("NOT JUDGED: no gate of the policy applies to this candidate (see ${Q_OUT}/index.md); a pass has to be earned")
endif()

# The format row, when a budget is asked for: what the scheme does to the model.
set(budget_verdict "")
if(Q_BUDGET AND NOT Q_SCHEME STREQUAL "bf16")
  step("the format row of ${Q_SCHEME} under --budget ${Q_BUDGET}")
  run(rc "${Q_QPARITY}" validate --model "${Q_MODEL}" --schemes "${Q_SCHEME}" --budget "${Q_BUDGET}"
      --no-engine --sequences "${Q_SEQUENCES}" --seq-len "${Q_SEQ_LEN}" --out "${Q_OUT}"
      --junit "${Q_OUT}/junit.xml" ${policy_args})
  if(rc EQUAL 3)
    set(budget_verdict FAIL)
  elseif(NOT rc EQUAL 0)
    fail("qparity validate (format row) exited ${rc}")
  endif()
endif()

# 5. Where it broke.
if(verdict STREQUAL "FAIL")
  file(GLOB goldens "${Q_OUT}/.work/*.candidate-golden.h5")
  list(LENGTH goldens n)
  if(NOT n EQUAL 1)
    fail("validate kept ${n} reference goldens in ${Q_OUT}/.work; expected one")
  endif()
  set(policy "")
  if(Q_POLICIES)
    file(GLOB policy "${Q_POLICIES}/${Q_SCHEME}.json")
  endif()
  set(bisect_policy "")
  if(policy)
    set(bisect_policy --policy "${policy}")
  endif()
  step("bisect: the first capture point outside the policy, and whether its layer is wrong")
  list(GET goldens 0 golden)
  execute_process(COMMAND "${Q_QPARITY}" bisect "${golden}" "${candidate}" --model "${checkpoint}"
                          ${bisect_policy}
                  RESULT_VARIABLE bisect_rc OUTPUT_VARIABLE bisect_out ERROR_VARIABLE bisect_err)
  file(WRITE "${Q_OUT}/bisect.txt" "${bisect_out}${bisect_err}")
  message("${bisect_out}${bisect_err}")
  if(bisect_out STREQUAL "")
    fail("qparity bisect exited ${bisect_rc} and printed nothing")
  endif()
endif()

message("qparity-accuracy: ${Q_NAME}: engine row ${verdict}; reports in ${Q_OUT} (index.md, junit.xml)")
if(Q_EXPECT_FAIL)
  if(NOT verdict STREQUAL "FAIL")
    fail("expected FAIL (EXPECT_FAIL), validate said ${verdict}")
  endif()
  message("qparity-accuracy: ${Q_NAME}: FAIL as expected; bisect: ${Q_OUT}/bisect.txt")
elseif(verdict STREQUAL "FAIL")
  fail("FAIL; bisect: ${Q_OUT}/bisect.txt, reports: ${Q_OUT}/index.md")
elseif(budget_verdict STREQUAL "FAIL")
  fail("the format row exceeds --budget ${Q_BUDGET} (${Q_OUT}/index.md)")
endif()
