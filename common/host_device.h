#pragma once
/// @file host_device.h
/// @brief IL_HD marks a function that the CPU code and the CUDA kernels both call: __host__
/// __device__ where nvcc compiles it, nothing for the C++ compiler.

#ifdef __CUDACC__
#define IL_HD __host__ __device__
#else
#define IL_HD
#endif
