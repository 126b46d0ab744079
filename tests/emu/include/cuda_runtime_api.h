// Stand-in for CUDA's runtime API header under the CPU emulator: see cuda_runtime.h.
#pragma once

#include "cuda_runtime.h"
