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
