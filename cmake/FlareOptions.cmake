# Build options and compiler flags shared by every target.
option(FLARE_WERROR "Treat warnings as errors (CI builds turn this on)" OFF)
option(FLARE_BUILD_TESTS "Build the tests" ON)
set(FLARE_CUDA_HOME "$ENV{CUDA_HOME}" CACHE PATH "CUDA toolkit root (headers, cuBLAS, NCCL)")
if(NOT FLARE_CUDA_HOME)
  set(FLARE_CUDA_HOME /usr/local/cuda CACHE PATH "" FORCE)
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

set(FLARE_WARNING_FLAGS -Wall -Wextra -Wshadow=local -Wnon-virtual-dtor -Wno-unused-parameter)
if(FLARE_WERROR)
  list(APPEND FLARE_WARNING_FLAGS -Werror)
endif()

# flare_target_defaults(TARGET): warnings and hidden visibility for Flare's own code.
function(flare_target_defaults target)
  target_compile_options(${target} PRIVATE ${FLARE_WARNING_FLAGS})
  set_target_properties(${target} PROPERTIES CXX_VISIBILITY_PRESET hidden
                                             VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
endfunction()

# libFuzzer targets (flare_add_fuzzer below): clang only, in a separate build (tools/fuzz/run.sh).
option(FLARE_FUZZ "Build the libFuzzer targets (clang only; tools/fuzz/run.sh)" OFF)
if(FLARE_FUZZ)
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  check_cxx_source_compiles(
    "#include <cstdint>\n#include <cstddef>\nextern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }"
    FLARE_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  if(NOT FLARE_HAVE_LIBFUZZER)
    message(WARNING "FLARE_FUZZ: the compiler does not support -fsanitize=fuzzer; skipped")
  endif()
endif()

# flare_add_fuzzer(TARGET SOURCE LIBS...): a libFuzzer target with address and undefined
# sanitizers, when FLARE_FUZZ is on and the compiler supports it; nothing otherwise.
function(flare_add_fuzzer target source)
  if(NOT FLARE_FUZZ OR NOT FLARE_HAVE_LIBFUZZER)
    return()
  endif()
  add_executable(${target} ${source})
  flare_target_defaults(${target})
  target_compile_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${target} PRIVATE ${ARGN})
endfunction()

# flare_add_test(NAME LABEL SOURCES... [LIBS ...]): a GoogleTest binary registered with ctest.
function(flare_add_test name label)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT FLARE_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  flare_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${name} PROPERTIES LABELS ${label} DISCOVERY_TIMEOUT 60)
endfunction()
