# ctest functions for a project that ships a quantized inference engine (installed with qparity;
# find_package(qparity) includes this file).
#
#   qparity_add_accuracy_tests(NAME name
#     MODEL dir                    floating-point Hugging Face checkpoint
#     SCHEMES id...                scheme ids or presets (qparity schemes --presets); bf16: the
#                                  model as it is, anything else is quantized from MODEL first
#     DEVICE key                   what runs the candidate: cpu, or a policy device key (sm90, ...)
#     CANDIDATE_COMMAND cmd...     runs the engine and writes its dump; placeholders @MODEL@ (the
#                                  checkpoint it must run), @TOKENS@ (a token file, one sequence
#                                  per line), @SEQUENCES@, @SEQ_LEN@, @CANDIDATE@ (the file to
#                                  write), @SCHEME@, @WORK@ (a scratch directory)
#     (TOKENS file | TEXT file)    token ids, or UTF-8 text for the checkpoint's tokenizer
#     [SEQUENCES S] [SEQ_LEN T]    how many sequences of how many tokens (default 2 x 32)
#     [DIALECT d]                  quantize MODEL under this dialect (default vllm)
#     [POLICIES dir]               tolerance policies (default: the installed ones)
#     [BUDGET kld=X,top1=Y,dln_ppl=Z]  also run the format row (what the scheme does to MODEL,
#                                  the quantized reference against the unquantized one) judged by
#                                  this end-to-end budget
#     [REPORTS dir]                report root (default <build>/qparity-reports); each test
#                                  writes <dir>/<name>/<scheme>/ (reports, index, junit.xml,
#                                  bisect.txt on FAIL) and keeps it
#     [EXPECT_FAIL]                the candidate is known to be wrong: the test passes only when
#                                  validate says FAIL and bisect ran (a planted fault in CI)
#     [LABELS l...] [TIMEOUT s] [FIXTURES_REQUIRED f...])
#
# One ctest test per scheme, named <name>.<scheme>, labelled qparity, the scheme and the device.
# Each: quantize (unless bf16) -> tokens -> CANDIDATE_COMMAND -> qparity validate --candidate
# (the reference golden of the same checkpoint, the engine policy of the scheme for the
# candidate's device) -> on FAIL qparity bisect --model, whose verdict table is printed and kept.
# NOT JUDGED (no policy gate applies) fails the test: a pass has to be earned. A GPU DEVICE on a
# machine without an NVIDIA GPU skips the test (ctest's "Skipped") with the reason.
#
#   qparity_add_git_bisect(NAME name GOOD rev BAD rev POLICY file GOLDEN file CANDIDATE file
#                          COMMAND cmd... [GIT_DIR dir])
# A build target qparity-bisect-<name> (not a test: it checks out commits) running
# `qparity bisect --git GOOD BAD --policy POLICY GOLDEN CANDIDATE -- COMMAND...` in GIT_DIR
# (default: the project's source directory): at each commit COMMAND builds and writes CANDIDATE.
include_guard(GLOBAL)

set(_QPARITY_ACCURACY_DRIVER "${CMAKE_CURRENT_LIST_DIR}/qparity_accuracy_test.cmake")

function(_qparity_executable out)
  if(TARGET qparity::qparity)
    set(${out} "$<TARGET_FILE:qparity::qparity>" PARENT_SCOPE)
  elseif(TARGET qparity)
    set(${out} "$<TARGET_FILE:qparity>" PARENT_SCOPE)  # inside qparity's own build
  else()
    message(FATAL_ERROR "qparity_add_accuracy_tests: no qparity::qparity target (find_package(qparity))")
  endif()
endfunction()

function(qparity_add_accuracy_tests)
  cmake_parse_arguments(PARSE_ARGV 0 A "EXPECT_FAIL"
    "NAME;MODEL;DEVICE;TOKENS;TEXT;SEQUENCES;SEQ_LEN;DIALECT;POLICIES;BUDGET;REPORTS;TIMEOUT"
    "SCHEMES;CANDIDATE_COMMAND;LABELS;FIXTURES_REQUIRED")
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "qparity_add_accuracy_tests: unknown arguments ${A_UNPARSED_ARGUMENTS}")
  endif()
  foreach(req NAME MODEL DEVICE SCHEMES CANDIDATE_COMMAND)
    if(NOT A_${req})
      message(FATAL_ERROR "qparity_add_accuracy_tests: ${req} is required")
    endif()
  endforeach()
  if((A_TOKENS AND A_TEXT) OR (NOT A_TOKENS AND NOT A_TEXT))
    message(FATAL_ERROR "qparity_add_accuracy_tests(${A_NAME}): give TOKENS or TEXT, one of them")
  endif()
  if(NOT A_NAME MATCHES "^[A-Za-z0-9_.-]+$")
    message(FATAL_ERROR "qparity_add_accuracy_tests: NAME '${A_NAME}' (letters, digits, _ . -)")
  endif()
  foreach(n SEQUENCES SEQ_LEN)
    if(DEFINED A_${n} AND NOT A_${n} MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "qparity_add_accuracy_tests(${A_NAME}): ${n} '${A_${n}}' is not a positive integer")
    endif()
  endforeach()
  if(NOT A_SEQUENCES)
    set(A_SEQUENCES 2)
  endif()
  if(NOT A_SEQ_LEN)
    set(A_SEQ_LEN 32)
  endif()
  if(NOT A_DIALECT)
    set(A_DIALECT vllm)
  endif()
  if(NOT A_REPORTS)
    set(A_REPORTS "${CMAKE_BINARY_DIR}/qparity-reports")
  endif()
  _qparity_executable(exe)
  foreach(path MODEL TOKENS TEXT POLICIES REPORTS)
    if(A_${path})
      get_filename_component(A_${path} "${A_${path}}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    endif()
  endforeach()
  foreach(scheme IN LISTS A_SCHEMES)
    if(NOT scheme MATCHES "^[A-Za-z0-9_.+-]+$")
      message(FATAL_ERROR "qparity_add_accuracy_tests(${A_NAME}): scheme '${scheme}'")
    endif()
    set(test "${A_NAME}.${scheme}")
    # The test's arguments in a file: commands keep their quoting, lists their semicolons.
    set(args "${CMAKE_CURRENT_BINARY_DIR}/qparity-accuracy/${test}.args.cmake")
    set(body "")
    foreach(var MODEL DEVICE TOKENS TEXT SEQUENCES SEQ_LEN DIALECT POLICIES BUDGET EXPECT_FAIL)
      string(APPEND body "set(Q_${var} [==[${A_${var}}]==])\n")
    endforeach()
    string(APPEND body "set(Q_SCHEME [==[${scheme}]==])\n")
    string(APPEND body "set(Q_NAME [==[${test}]==])\n")
    string(APPEND body "set(Q_QPARITY [==[${exe}]==])\n")
    string(APPEND body "set(Q_OUT [==[${A_REPORTS}/${A_NAME}/${scheme}]==])\n")
    string(APPEND body "set(Q_WORK [==[${CMAKE_CURRENT_BINARY_DIR}/qparity-accuracy/${test}]==])\n")
    string(APPEND body "set(Q_COMMAND)\n")
    foreach(word IN LISTS A_CANDIDATE_COMMAND)
      string(APPEND body "list(APPEND Q_COMMAND [==[${word}]==])\n")
    endforeach()
    # Generator expressions ($<TARGET_FILE:...>) in the command resolve at generate time.
    file(GENERATE OUTPUT "${args}" CONTENT "${body}")
    add_test(NAME "${test}" COMMAND "${CMAKE_COMMAND}" -DQ_ARGS=${args} -P "${_QPARITY_ACCURACY_DRIVER}")
    set(labels qparity "${scheme}" "${A_DEVICE}" ${A_LABELS})
    set_tests_properties("${test}" PROPERTIES LABELS "${labels}"
                         SKIP_REGULAR_EXPRESSION "qparity-accuracy: SKIPPED")
    if(A_TIMEOUT)
      set_tests_properties("${test}" PROPERTIES TIMEOUT "${A_TIMEOUT}")
    endif()
    if(A_FIXTURES_REQUIRED)
      set_tests_properties("${test}" PROPERTIES FIXTURES_REQUIRED "${A_FIXTURES_REQUIRED}")
    endif()
  endforeach()
endfunction()

function(qparity_add_git_bisect)
  cmake_parse_arguments(PARSE_ARGV 0 A "" "NAME;GOOD;BAD;POLICY;GOLDEN;CANDIDATE;GIT_DIR" "COMMAND")
  foreach(req NAME GOOD BAD POLICY GOLDEN CANDIDATE COMMAND)
    if(NOT A_${req})
      message(FATAL_ERROR "qparity_add_git_bisect: ${req} is required")
    endif()
  endforeach()
  if(NOT A_GIT_DIR)
    set(A_GIT_DIR "${PROJECT_SOURCE_DIR}")
  endif()
  _qparity_executable(exe)
  add_custom_target("qparity-bisect-${A_NAME}"
    COMMAND "${exe}" bisect --git "${A_GOOD}" "${A_BAD}" --policy "${A_POLICY}" "${A_GOLDEN}"
            "${A_CANDIDATE}" -- ${A_COMMAND}
    WORKING_DIRECTORY "${A_GIT_DIR}" USES_TERMINAL VERBATIM
    COMMENT "qparity bisect --git ${A_GOOD} ${A_BAD}: the first commit whose candidate leaves ${A_POLICY}")
endfunction()
