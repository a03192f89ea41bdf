#pragma once
// The fp64 working sets of a real-size run are large (one Llama-3-8B linear's weight as fp64 is
// 940 MB, made and freed for every linear the quantizer writes), and each fresh allocation faults
// its pages in 4 KB at a time; on a virtual machine that costs more than the arithmetic (a
// one-layer 8B-shaped `quantize` to fp8-block on this project's 2-core machine: 32 s with 4 KB
// pages, 17 s with huge pages). glibc's malloc asks the kernel for transparent huge pages when
// GLIBC_TUNABLES holds glibc.malloc.hugetlb=1, which only the environment at process start sets.
//
// So main() calls this first: unless the variable already says so (or QPARITY_NO_HUGE_PAGES is
// set), it adds the tunable and executes /proc/self/exe again with the same arguments. Nothing
// else changes: same process id, same descriptors, no output; where the exec fails the run simply
// goes on with 4 KB pages.
namespace qparity::cli {

void reexec_with_huge_page_malloc(char** argv);

}  // namespace qparity::cli
