# Small helpers so every target is declared the same way.
#
# attnserve_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [CUDA])
# attnserve_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [TIMEOUT s])
# attnserve_cc_binary(NAME name SRCS ... [DEPS ...])

function(_attnserve_cpu_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(ATTNSERVE_CPU_ARCH)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=${ATTNSERVE_CPU_ARCH}>)
  endif()
endfunction()

function(attnserve_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SRCS} ${A_HDRS})
  target_include_directories(${A_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${A_NAME} PUBLIC ${A_DEPS})
  set_target_properties(${A_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  _attnserve_cpu_flags(${A_NAME})
endfunction()

function(attnserve_cc_binary)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_include_directories(${A_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  _attnserve_cpu_flags(${A_NAME})
endfunction()

# Tests get the label "cpu" unless LABELS says otherwise.
function(attnserve_cc_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  target_include_directories(${A_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  _attnserve_cpu_flags(${A_NAME})
  if(NOT A_LABELS)
    set(A_LABELS cpu)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT})
  # Sanitizer builds (cmake/Sanitizers.cmake): the chosen tests get the sanitizer's label and
  # options.
  if(A_NAME IN_LIST ATTNSERVE_SANITIZER_TESTS)
    set_property(TEST ${A_NAME} APPEND PROPERTY LABELS ${ATTNSERVE_SANITIZER_LABEL})
    set_property(TEST ${A_NAME} PROPERTY ENVIRONMENT ${ATTNSERVE_SANITIZER_ENV})
  endif()
endfunction()
