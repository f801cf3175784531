# Sanitizer and fuzzing builds (make sanitize, make tsan, make fuzz; docs/DEVELOPERS.md).
#
#   ATTNSERVE_SANITIZER=address  ASan + UBSan on every target, UBSan fatal (-fno-sanitize-recover)
#   ATTNSERVE_SANITIZER=thread   TSan on every target
#   ATTNSERVE_BUILD_FUZZERS=ON   the libFuzzer targets of tests/fuzz (clang only; implies address)
#
# Every target of the build is instrumented, but the system libraries (gRPC, protobuf, abseil,
# Eigen is header-only and so is instrumented) are not: tests/sanitizers/ holds the suppressions
# that this requires, and the ctest environment of the sanitizer tests points at them.
set(ATTNSERVE_SANITIZER "" CACHE STRING "instrument the build: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE ATTNSERVE_SANITIZER PROPERTY STRINGS "" address thread)
option(ATTNSERVE_BUILD_FUZZERS "build the libFuzzer targets of tests/fuzz (clang; ASan+UBSan)" OFF)

if(ATTNSERVE_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ATTNSERVE_BUILD_FUZZERS needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
  if(ATTNSERVE_SANITIZER STREQUAL "")
    set(ATTNSERVE_SANITIZER address CACHE STRING "" FORCE)
  elseif(NOT ATTNSERVE_SANITIZER STREQUAL "address")
    message(FATAL_ERROR "ATTNSERVE_BUILD_FUZZERS runs under ASan+UBSan: ATTNSERVE_SANITIZER must "
                        "be address or empty, not '${ATTNSERVE_SANITIZER}'")
  endif()
endif()

# Line tables are all a sanitizer report needs (clang's -gline-tables-only, gcc's -g1).
set(_attnserve_san_debug $<IF:$<CXX_COMPILER_ID:Clang>,-gline-tables-only,-g1>)
if(ATTNSERVE_SANITIZER STREQUAL "address")
  # -O1 keeps Eigen's kernels fast enough for the CPU tests; line tables are all a report needs.
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  add_compile_options(${_san} -fno-omit-frame-pointer -O1 ${_attnserve_san_debug})
  add_link_options(${_san})
  if(ATTNSERVE_BUILD_FUZZERS)
    # Coverage feedback from every library a fuzz target links (the targets link libFuzzer).
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
  message(STATUS "attnserve: ASan + UBSan build")
elseif(ATTNSERVE_SANITIZER STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer -O1 ${_attnserve_san_debug})
  add_link_options(-fsanitize=thread)
  message(STATUS "attnserve: TSan build")
elseif(NOT ATTNSERVE_SANITIZER STREQUAL "")
  message(FATAL_ERROR "ATTNSERVE_SANITIZER must be address, thread or empty, got "
                      "'${ATTNSERVE_SANITIZER}'")
endif()

# Which tests a sanitizer build runs (make sanitize: ctest -L asan; make tsan: ctest -L tsan) and
# the options and suppressions they run with; attnserve_cc_test labels them.
# ASan + UBSan: the CPU unit tests (engine, parallel on CPU workers, wire, server in process,
# client against a scripted server). Integration tests that start the attnserve binary are left
# out: building attnserve and attnctl instrumented costs more CI time than the in-process service
# tests, which run the same handlers.
set(_asan_tests
  check_test flag_names_test thread_pool_test log_safe_test tensor_test spec_test reference_test
  cpu_backend_test cpu_rect_test cpu_merge_test
  parallel_communicator_test parallel_ring_test parallel_planner_test parallel_data_parallel_test
  parallel_context_parallel_test parallel_ring_cuda_plan_test parallel_dilated_ring_test
  wire_test server_unit_test auth_test context_store_test region_registry_test service_test
  sharded_context_test attn_client_test attnctl_flags_test attnctl_output_test)
# TSan: what runs our threads against each other: the thread pool, the scheduler and its lanes
# (with the request assembler), the context store, the CPU communicator and rings. Not the gRPC
# service tests (service_test, sharded_context_test, the integration tests): Debian's gRPC,
# protobuf and abseil are not instrumented, so TSan sees none of the synchronisation by which
# gRPC hands a message or a reactor from one of its threads to the next, and reports hundreds of
# races inside gRPC and on every object that crosses such a handoff (our frames included), which
# no suppression can separate from real ones. Those tests need a gRPC built with -fsanitize=thread.
set(_tsan_tests
  thread_pool_test server_unit_test auth_test context_store_test parallel_communicator_test
  parallel_ring_test)

set(_dir ${PROJECT_SOURCE_DIR}/tests/sanitizers)
if(ATTNSERVE_SANITIZER STREQUAL "address")
  set(_label asan)
  set(_tests ${_asan_tests})
  # detect_leaks stays on; lsan.supp lists the system libraries' process-lifetime allocations.
  # allocator_may_return_null: an impossible allocation returns null as it does without ASan
  # (HostTensor::Create turns that into RESOURCE_EXHAUSTED, which tensor_test checks), instead of
  # ASan's allocation-size-too-big abort.
  set(_env
    "ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
    "LSAN_OPTIONS=suppressions=${_dir}/lsan.supp:print_suppressions=0"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${_dir}/ubsan.supp")
elseif(ATTNSERVE_SANITIZER STREQUAL "thread")
  set(_label tsan)
  set(_tests ${_tsan_tests})
  set(_env "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=${_dir}/tsan.supp")
endif()
if(NOT ATTNSERVE_SANITIZER STREQUAL "")
  set(ATTNSERVE_SANITIZER_TESTS ${_tests})
  set(ATTNSERVE_SANITIZER_LABEL ${_label})
  set(ATTNSERVE_SANITIZER_ENV ${_env})
endif()

