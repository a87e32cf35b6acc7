// The device functions of a program written against NCCL's nccl.h for
// device buffers: braid's (braidDeviceSetCurrent, ...) where the
// libnccl.so.2 the program loaded is braid's, so that it also runs on a
// device CUDA does not know (BRAID_DEVICE=emulated); else the CUDA
// runtime's. Both are looked up at run time: the program needs no CUDA
// library to start, and the same binary runs on NVIDIA's NCCL unchanged.
#pragma once

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

namespace braid::peers {

class NcclDeviceCalls {
 public:
  int (*setCurrent)(int) = nullptr;
  int (*streamCreate)(void**) = nullptr;
  int (*streamSynchronize)(void*) = nullptr;
  int (*streamDestroy)(void*) = nullptr;
  int (*copy)(void*, const void*, size_t) = nullptr;  // any direction; waits

  // Exits with a message when neither set of functions is there.
  explicit NcclDeviceCalls(const char* program) {
    find(RTLD_DEFAULT, "braidDeviceSetCurrent", &setCurrent);
    find(RTLD_DEFAULT, "braidDeviceStreamCreate", &streamCreate);
    find(RTLD_DEFAULT, "braidDeviceStreamSynchronize", &streamSynchronize);
    find(RTLD_DEFAULT, "braidDeviceStreamDestroy", &streamDestroy);
    find(RTLD_DEFAULT, "braidDeviceCopy", &copy);
    if (setCurrent && streamCreate && streamSynchronize && streamDestroy && copy) {
      braid_ = true;
      return;
    }
    void* cudart = dlopen("libcudart.so.13", RTLD_NOW);
    if (!cudart) cudart = dlopen("libcudart.so", RTLD_NOW);
    if (!cudart) {
      fprintf(stderr, "%s: neither braid's device functions nor the CUDA runtime can be found\n",
              program);
      exit(1);
    }
    find(cudart, "cudaSetDevice", &setCurrent);
    find(cudart, "cudaStreamCreate", &streamCreate);
    find(cudart, "cudaStreamSynchronize", &streamSynchronize);
    find(cudart, "cudaStreamDestroy", &streamDestroy);
    find(cudart, "cudaMemcpy", &cudaMemcpy_);
    copy = [](void* dst, const void* src, size_t bytes) {
      return cudaMemcpy_(dst, src, bytes, kCudaMemcpyDefault);
    };
    if (!setCurrent || !streamCreate || !streamSynchronize || !streamDestroy || !cudaMemcpy_) {
      fprintf(stderr, "%s: the CUDA runtime lacks a function this program uses\n", program);
      exit(1);
    }
  }

  // Whether these are braid's functions (the loaded libnccl.so.2 is braid's).
  bool braid() const { return braid_; }

  // Exits naming `what` when a call failed.
  static void check(int status, const char* program, const char* what) {
    if (status == 0) return;
    fprintf(stderr, "%s: %s failed with status %d\n", program, what, status);
    exit(1);
  }

 private:
  template <typename F>
  static void find(void* from, const char* name, F* f) {
    *f = reinterpret_cast<F>(dlsym(from, name));
  }

  // cudaMemcpyDefault (the runtime infers the direction), by value: this
  // header needs no CUDA header of its own.
  static constexpr int kCudaMemcpyDefault = 4;
  static inline int (*cudaMemcpy_)(void*, const void*, size_t, int) = nullptr;
  bool braid_ = false;
};

}  // namespace braid::peers
