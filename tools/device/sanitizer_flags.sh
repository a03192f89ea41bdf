# Sourced by the device scripts (run.sh, prebuilt.sh): what every device run exports, and the
# compute-sanitizer flags a gpu suite is judged with.
# NVLink multicast stays off on these shared hosts (KINDS.md): a program that uses it can take the
# host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# sanitizer_flags SUITE TOOL: the extra flags for that suite under that tool. NCCL probes kernel
# images and re-enables peer access, and handles the API errors it gets back (310 of them on
# 2 x H200, all inside libnccl): memory errors alone judge the tensor-parallel suite.
sanitizer_flags() {
  case "$(basename "$1")" in
  test_gpu_tensor_parallel | test_gpu_engine_tp)
    [ "$2" = memcheck ] && echo "--report-api-errors no" ;;
  esac
  return 0
}
