# RINGTREE_SANITIZE: build the library, the tests and the benchmarks with GCC/Clang
# sanitizers. A comma-separated list of -fsanitize= values: "thread", "address",
# "undefined" or "address,undefined"; empty (the default) builds without. The flags are set
# for this directory and the ones below it only, so a project that adds ringtree with
# add_subdirectory keeps its own flags (it must then link its executables with the same
# -fsanitize= itself). Use a build folder per sanitizer; see docs/testing.md.
set(RINGTREE_SANITIZE "" CACHE STRING "Sanitizers to build with: thread, address, undefined or address,undefined")

if(RINGTREE_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "RINGTREE_SANITIZE needs GCC or Clang, not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  string(REPLACE "," ";" _ringtree_sanitizers "${RINGTREE_SANITIZE}")
  foreach(_ringtree_sanitizer IN LISTS _ringtree_sanitizers)
    if(NOT _ringtree_sanitizer MATCHES "^(thread|address|undefined)$")
      message(FATAL_ERROR "RINGTREE_SANITIZE: unknown sanitizer '${_ringtree_sanitizer}' "
                          "(thread, address or undefined)")
    endif()
  endforeach()
  if("thread" IN_LIST _ringtree_sanitizers AND "address" IN_LIST _ringtree_sanitizers)
    message(FATAL_ERROR "RINGTREE_SANITIZE: thread and address cannot be combined")
  endif()
  # -g keeps reports readable in every build type; frame pointers give full stacks cheaply.
  # Reports need line tables, not the locations of variables: GCC's tracking of those
  # would take most of an instrumented build's compile time (3x, for the test programs).
  # Undefined behaviour stops the program (as the other sanitizers do) instead of printing
  # and carrying on, so a report fails the test that triggered it.
  set(_ringtree_sanitize_flags -fsanitize=${RINGTREE_SANITIZE} -fno-omit-frame-pointer -g)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND _ringtree_sanitize_flags -fno-var-tracking-assignments)
  endif()
  if("undefined" IN_LIST _ringtree_sanitizers)
    list(APPEND _ringtree_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_ringtree_sanitize_flags})
  add_link_options(-fsanitize=${RINGTREE_SANITIZE})
  message(STATUS "ringtree: building with -fsanitize=${RINGTREE_SANITIZE}")
endif()
