// abi_check.c compiled as C++ (with CUDA's headers where the toolkit is found).
#include "abi_check.c"
