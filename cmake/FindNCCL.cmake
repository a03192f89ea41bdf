# FindNCCL: NCCL has no CMake package of its own. Looks in NCCL_ROOT (e.g. the pip package
# nvidia-nccl-cu13's directory), then the CUDA toolkit. Defines NCCL::nccl and NCCL_FOUND.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT}/include $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
