# Compiler cache: on by default when ccache is installed (scripts/install-deps.sh installs it), so
# a second build of the same sources, in any clone on the same machine, compiles nothing.
# The cache lives outside the clone (ccache's own default, ~/.cache/ccache, or $CCACHE_DIR).
# base_dir makes the paths under the source tree relative before hashing and hash_dir=false
# leaves the build directory's absolute path out of the hash, so two clones in different folders
# share entries (debug info then names the first clone's directory; line tables are unaffected).
# -DQPARITY_CCACHE=OFF builds without it.
find_program(QPARITY_CCACHE_PROGRAM ccache)
set(_qparity_ccache_default OFF)
if(QPARITY_CCACHE_PROGRAM)
  set(_qparity_ccache_default ON)
endif()
option(QPARITY_CCACHE "Compile through ccache when it is installed" ${_qparity_ccache_default})
if(QPARITY_CCACHE AND NOT QPARITY_CCACHE_PROGRAM)
  message(FATAL_ERROR "QPARITY_CCACHE=ON but ccache was not found (Debian: apt-get install ccache)")
endif()
if(QPARITY_CCACHE)
  # Through `cmake -E env` so the settings hold for this build alone, whatever the user's ccache.conf.
  set(_qparity_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
                        CCACHE_NOHASHDIR=1 ${QPARITY_CCACHE_PROGRAM})
  foreach(_lang IN ITEMS C CXX CUDA)
    if(NOT DEFINED CMAKE_${_lang}_COMPILER_LAUNCHER)
      set(CMAKE_${_lang}_COMPILER_LAUNCHER ${_qparity_launcher})
    endif()
  endforeach()
  message(STATUS "qparity: compiling through ${QPARITY_CCACHE_PROGRAM} (base_dir ${PROJECT_SOURCE_DIR})")
endif()
