// A cache of large CPU blocks (internal).
//
// Large blocks come from mmap and return to the kernel on free, so every new
// multi-megabyte tensor pays a page fault per 4 KiB on first touch: a 64 MiB GEMM
// output costs ~16K faults, 10-20% of the GEMM itself, and a training step
// allocates the same activation sizes every step. Freed blocks of at least 1 MiB
// are kept (sizes rounded up to 64 KiB, exact-size reuse) up to a byte budget and
// handed out again. Small blocks go straight to malloc, which caches them already.
// The tensors' memory counters are unaffected: they count live tensor bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtensor::backend::cpu {

void* cached_allocate(size_t bytes);
void cached_free(void* ptr, size_t bytes);
// Bytes held in the cache (not owned by any tensor).
int64_t cached_bytes();
// Returns every cached block to the system.
void release_cached_blocks();

}  // namespace dtensor::backend::cpu
