# Sourced by the GPU scripts (gpu-check-model.sh, gpu-session-check.sh): what binaries built on the
# build machine need to run NCCL on the GPU machine.
# - NCCL_NVLS_ENABLE=0: NVLink multicast (NVLS) stays off on the lent GPU machines.
# - libnccl.so.2 from the Python wheel nvidia-nccl-cu13 (site-packages/nvidia/nccl/lib), put ahead
#   of the binaries' RUNPATH (the build machine's /usr/local/cuda/lib). nvidia.nccl may be a
#   namespace package (no __init__.py, __file__ None): then its __path__.
export NCCL_NVLS_ENABLE=0
nccl_wheel_lib=$(python3 -c "import os, nvidia.nccl as m
d = os.path.dirname(m.__file__) if getattr(m, '__file__', None) else list(m.__path__)[0]
print(os.path.join(d, 'lib'))" 2>/dev/null || true)
if [[ -n "$nccl_wheel_lib" && -e "$nccl_wheel_lib/libnccl.so.2" ]]; then
  export LD_LIBRARY_PATH=$nccl_wheel_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  echo "nccl-env: no nvidia-nccl wheel for python3 here; libnccl.so.2 comes from the loader's path" >&2
fi
unset nccl_wheel_lib
