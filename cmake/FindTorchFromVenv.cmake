# Locates LibTorch inside the project's venv (.venv, made by scripts/setup.sh) through
# torch.utils.cmake_prefix_path, so nobody has to pass -DCMAKE_PREFIX_PATH by hand.
# The same file works on the GPU machine, where GCLAB_PYTHON points at that machine's python.
set(GCLAB_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python whose torch provides LibTorch")
if(NOT EXISTS "${GCLAB_PYTHON}")
  message(FATAL_ERROR "No Python at ${GCLAB_PYTHON}. Run scripts/setup.sh first (it creates .venv with torch), "
                      "or pass -DGCLAB_PYTHON=/path/to/python whose 'import torch' works.")
endif()
execute_process(
  COMMAND "${GCLAB_PYTHON}" -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "${GCLAB_PYTHON} cannot import torch: ${_torch_err}\nRun scripts/setup.sh.")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 GCLAB_TORCH_PREFIX)
list(GET _torch_info 1 GCLAB_TORCH_VERSION)
list(GET _torch_info 2 GCLAB_TORCH_CXX11_ABI)
list(APPEND CMAKE_PREFIX_PATH "${GCLAB_TORCH_PREFIX}")

# The wheel's CUDA build needs the CUDA toolkit at configure time (Caffe2's public/cuda.cmake).
# Use the system toolkit when present; a machine without one falls back to a CPU-only configure.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS "/usr/local/cuda/bin/nvcc")
  set(CUDAToolkit_ROOT "/usr/local/cuda")
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS "/usr/local/cuda/bin/nvcc")
  set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
endif()
if(CMAKE_CUDA_COMPILER)
  # Enable CUDA here, before Caffe2's cuda.cmake does, so that CMake's default CMAKE_CUDA_ARCHITECTURES
  # can be dropped: torch selects architectures from TORCH_CUDA_ARCH_LIST and warns when both are set.
  enable_language(CUDA)
  unset(CMAKE_CUDA_ARCHITECTURES CACHE)
  unset(CMAKE_CUDA_ARCHITECTURES)
endif()
# The wheel links Kineto (the profiler) statically into libtorch_cpu; TorchConfig still looks for a
# separate libkineto and warns. Point that lookup at libtorch_cpu, which is linked anyway.
if(NOT DEFINED kineto_LIBRARY)
  set(kineto_LIBRARY "${GCLAB_TORCH_PREFIX}/../../lib/libtorch_cpu.so" CACHE FILEPATH "")
endif()
# Hopper (H200) is the GPU this project measures on; the arch list only matters for our own .cu files.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "gclab: LibTorch ${GCLAB_TORCH_VERSION} from ${GCLAB_TORCH_PREFIX} (CUDA: ${CAFFE2_USE_CUDA})")
