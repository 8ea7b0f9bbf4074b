/* Flare's custom-kernel registration API.
 *
 * An infrastructure team declares what a custom kernel is and how many FLOPs (or bytes) one
 * launch performs, so that Flare reports its TFLOPS like a GEMM's. Call it once per kernel,
 * e.g. at module load, from any thread, before or after the kernel's first launch:
 *
 *   static uint64_t flashFlops(void** args, unsigned grid_x, unsigned grid_y, unsigned grid_z,
 *                              unsigned block_x, unsigned block_y, unsigned block_z) {
 *     const Params* p = (const Params*)args[0];
 *     return 4ull * p->b * p->h * p->s_q * p->s_k * p->d / (p->causal ? 2 : 1);
 *   }
 *   flare_register_kernel("flash::flash_fwd_kernel", FLARE_KIND_ATTENTION, flashFlops, NULL);
 *
 * `name_prefix` is compared with the start of the demangled kernel name. The callbacks run on
 * the launching thread for every launch of a matching kernel: they must be fast, must not
 * block, and must not call CUDA. `args` is the launch's kernel-parameter array (as passed to
 * cudaLaunchKernel / cuLaunchKernel); it may be NULL when the launch used the `extra` form.
 *
 * The functions live in libflare_hook.so. A program that must also run without Flare looks
 * them up with dlsym(RTLD_DEFAULT, "flare_register_kernel") and skips registration when absent.
 */
#ifndef FLARE_KERNELS_H_
#define FLARE_KERNELS_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum flare_kernel_kind {
  FLARE_KIND_KERNEL = 1,
  FLARE_KIND_GEMM = 2,
  FLARE_KIND_ATTENTION = 3,
};

typedef uint64_t (*flare_amount_fn)(void** args, unsigned grid_x, unsigned grid_y,
                                    unsigned grid_z, unsigned block_x, unsigned block_y,
                                    unsigned block_z);

/* Returns 0 on success, -1 on a bad argument (NULL or empty prefix, unknown kind), -2 when the
 * registry is full (256 entries). A later registration of the same prefix replaces the earlier
 * one for kernels not yet seen. `flops` and `bytes` may be NULL. */
int flare_register_kernel(const char* name_prefix, int kind, flare_amount_fn flops,
                          flare_amount_fn bytes);

/* The same without callbacks, for callers that cannot give a C function (the Python binding,
 * `flare.register_kernel`): one launch performs
 *   flops = flops_per_launch + flops_per_block * grid_x * grid_y * grid_z
 * (likewise bytes), e.g. a tiled kernel whose every block computes one BM x BN tile over K:
 * flops_per_block = 2 * BM * BN * K. Amounts are non-negative; 0 and 0 mean unknown. Returns
 * flare_register_kernel's codes (-1 also for a negative or non-finite amount). */
int flare_register_kernel_linear(const char* name_prefix, int kind, double flops_per_launch,
                                 double flops_per_block, double bytes_per_launch,
                                 double bytes_per_block);

#ifdef __cplusplus
}
#endif

#endif /* FLARE_KERNELS_H_ */
