# Finds torch from the Python that runs the build, the way torch.utils.cpp_extension does, without
# TorchConfig.cmake (which insists on a CUDA toolkit matching torch's even for CPU-only builds).
# Defines the interface target hfnn_torch.
find_package(Python COMPONENTS Interpreter REQUIRED)
execute_process(
  COMMAND ${Python_EXECUTABLE} -c "
import torch, torch.utils.cpp_extension as ce
print(','.join(ce.include_paths()))
print(','.join(ce.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(int(torch.version.cuda is not None))
print(torch.__version__)"
  OUTPUT_VARIABLE _hfnn_torch_out
  ERROR_VARIABLE _hfnn_torch_err
  RESULT_VARIABLE _hfnn_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _hfnn_torch_rc EQUAL 0)
  message(FATAL_ERROR "hfnn: cannot import torch with ${Python_EXECUTABLE}: install torch first (pip install torch) "
                      "and build against it with `pip install --no-build-isolation .` (an isolated build does not "
                      "see your torch), or configure with -DHFNN_TORCH=OFF.\n${_hfnn_torch_err}")
endif()
string(REPLACE "\n" ";" _hfnn_torch_lines "${_hfnn_torch_out}")
list(GET _hfnn_torch_lines 0 _inc)
list(GET _hfnn_torch_lines 1 _lib)
list(GET _hfnn_torch_lines 2 _abi)
list(GET _hfnn_torch_lines 3 _torch_cuda)
list(GET _hfnn_torch_lines 4 HFNN_TORCH_VERSION)
string(REPLACE "," ";" _inc "${_inc}")
string(REPLACE "," ";" _lib "${_lib}")
message(STATUS "hfnn: torch ${HFNN_TORCH_VERSION} at ${_lib}")

add_library(hfnn_torch INTERFACE)
target_include_directories(hfnn_torch SYSTEM INTERFACE ${_inc})
target_compile_definitions(hfnn_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi} TORCH_API_INCLUDE_EXTENSION_H)
target_link_directories(hfnn_torch INTERFACE ${_lib})
target_link_libraries(hfnn_torch INTERFACE c10 torch torch_cpu)
if(HFNN_WITH_CUDA AND _torch_cuda)
  target_link_libraries(hfnn_torch INTERFACE c10_cuda torch_cuda CUDA::cudart)
  target_compile_definitions(hfnn_torch INTERFACE HFNN_TORCH_CUDA=1)
elseif(HFNN_WITH_CUDA)
  message(STATUS "hfnn: torch was built without CUDA, the op library will not call the kernels")
endif()
