# The kernel libraries sit below the tensor core: nothing in core/cpu/ or
# core/kernels/ may include the Tensor, autograd or op headers.
file(GLOB_RECURSE sources ${ROOT}/core/cpu/* ${ROOT}/core/kernels/*)
set(bad "")
foreach(f ${sources})
  file(STRINGS ${f} lines REGEX "#include \"core/(tensor|autograd|ops|allocator)[./]")
  if(lines)
    list(APPEND bad "${f}: ${lines}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "kernel sources include the tensor core:\n${bad}")
endif()
