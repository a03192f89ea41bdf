# The installed package: `cmake --install` puts the qparity executable, its policies and trained
# fixtures, the golden library (the schema reader and writer, the C++ candidate writer, compare,
# policies, reports) with its headers, and a CMake package config under <prefix>:
#   bin/qparity
#   include/qparity/{core,schemes/description,schemes/parallel,golden}/*.h
#   lib/libqparity_{core,scheme_description,golden}.a
#   lib/cmake/qparity/{qparityConfig,qparityConfigVersion,qparityTargets*,
#                      qparityAccuracyTests,qparity_accuracy_test}.cmake
#   share/qparity/{policies,fixtures/trained}
# A downstream project: find_package(qparity CONFIG REQUIRED), then link qparity::golden, run
# qparity::qparity, and register accuracy tests with qparity_add_accuracy_tests()
# (cmake/qparityAccuracyTests.cmake). examples/downstream/ is such a project, built in CI.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QPARITY_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/qparity)
set(QPARITY_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/qparity)

# The golden library and what it stands on; qparity_options only for its link-only sanitizer
# flags (a static library's private dependencies are part of its export).
set_target_properties(qparity_golden PROPERTIES EXPORT_NAME golden)
set_target_properties(qparity_scheme_description PROPERTIES EXPORT_NAME scheme_description)
set_target_properties(qparity_core PROPERTIES EXPORT_NAME core)
set_target_properties(qparity_options PROPERTIES EXPORT_NAME options)
set_target_properties(qparity PROPERTIES EXPORT_NAME qparity
                      # cuBLAS and friends stay findable from the installed binary
                      INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS qparity_options qparity_core qparity_scheme_description qparity_golden
        EXPORT qparityTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${QPARITY_INSTALL_INCLUDEDIR})
install(TARGETS qparity EXPORT qparityTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT qparityTargets NAMESPACE qparity:: DESTINATION ${QPARITY_INSTALL_CMAKEDIR})

# Headers keep their source paths under include/qparity, so "golden/compare.h" (as the sources
# spell it) and "qparity/golden/compare.h" both resolve. The golden producers that run the
# reference or the GPU engine (reference_run, layer_rerun, engine_golden) are not part of the
# library and their headers stay out.
foreach(dir core schemes/description schemes/parallel golden)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${QPARITY_INSTALL_INCLUDEDIR}/${dir}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "reference_run.h" EXCLUDE PATTERN "layer_rerun.h" EXCLUDE
          PATTERN "engine_golden.h" EXCLUDE PATTERN "data" EXCLUDE)
endforeach()

set(QPARITY_PACKAGE_CUDA_ENGINE ${QPARITY_CUDA})
get_target_property(QPARITY_PACKAGE_HDF5_LIBRARIES HDF5::HDF5 INTERFACE_LINK_LIBRARIES)
get_target_property(QPARITY_PACKAGE_PCRE2_LIBRARIES PkgConfig::PCRE2 INTERFACE_LINK_LIBRARIES)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qparityConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/qparityConfig.cmake
                              INSTALL_DESTINATION ${QPARITY_INSTALL_CMAKEDIR}
                              PATH_VARS CMAKE_INSTALL_DATADIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qparityConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qparityConfig.cmake
              ${PROJECT_BINARY_DIR}/qparityConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/qparityAccuracyTests.cmake
              ${PROJECT_SOURCE_DIR}/cmake/qparity_accuracy_test.cmake
        DESTINATION ${QPARITY_INSTALL_CMAKEDIR})

# A Debian package of the same tree: `cpack -G DEB` in the build directory (stripped binaries,
# installed under /usr). The -dev packages are dependencies because a downstream project links
# the static golden library against them (their .so symlinks, nlohmann-json's headers).
set(CPACK_PACKAGE_NAME qparity)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "numerical-truth toolkit for quantized LLM inference: fp64 reference, golden dumps, judge")
set(CPACK_PACKAGE_CONTACT "qparity developers")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libhdf5-dev, libpcre2-dev, nlohmann-json3-dev, libgomp1, libstdc++6")
include(CPack)
