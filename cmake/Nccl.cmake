# NCCL for m3_parallel_nccl, looked for only when the CUDA backend is built. Found in the CUDA
# toolkit (this machine and CI: /usr/local/cuda/include/nccl.h, /usr/local/cuda/lib/libnccl.so), at
# NCCL_ROOT, or in the Python wheel nvidia-nccl-cu13 (site-packages/nvidia/nccl/{include,lib}; the
# wheel ships libnccl.so.2 without the unversioned link). The GPU machine runs binaries built here
# against the wheel's library: scripts/nccl-env.sh puts it on LD_LIBRARY_PATH.
# Sets M3_HAVE_NCCL and the imported target Nccl::nccl.
set(M3_HAVE_NCCL OFF)
if(NOT M3_HAVE_CUDA)
  return()
endif()

set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "Where NCCL is installed (include/nccl.h, lib/libnccl.so)")
# nvidia.nccl is a namespace package in some wheels (no __init__.py, __file__ None): __path__ then.
find_package(Python3 COMPONENTS Interpreter QUIET)
set(m3_nccl_wheel "")
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import os, nvidia.nccl as m
print(os.path.dirname(m.__file__) if getattr(m, '__file__', None) else list(m.__path__)[0])"
    OUTPUT_VARIABLE m3_nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
get_filename_component(m3_cuda_root "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)

find_path(NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${m3_cuda_root} ${m3_nccl_wheel}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
             HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${m3_cuda_root} ${m3_nccl_wheel}
             PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" m3_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^0-9;]" "" m3_nccl_version "${m3_nccl_version}")
  string(REPLACE ";" "." m3_nccl_version "${m3_nccl_version}")
  add_library(Nccl::nccl SHARED IMPORTED)
  set_target_properties(Nccl::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  set(M3_HAVE_NCCL ON)
  message(STATUS "m3serve: NCCL ${m3_nccl_version} (${NCCL_LIBRARY})")
else()
  message(STATUS "m3serve: NCCL not found (set NCCL_ROOT): m3_parallel_nccl is not built")
endif()
